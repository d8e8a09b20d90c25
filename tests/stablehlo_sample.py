"""Hand-written StableHLO modules for test_stablehlo.py: custom calls in
typed-FFI and other encodings, a called function, and shard_map bodies as
Shardy and as GSPMD lower them."""

TEXT = """
module @m {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xui8> {
    %0 = stablehlo.custom_call @legacy(%arg0) {backend_config = "opaque"} : (tensor<4xf32>) -> tensor<4xf32>
    %1 = stablehlo.custom_call @typed(%0) {api_version = 4 : i32} : (tensor<4xf32>) -> tensor<4xui8>
    %2 = func.call @inner(%1) : (tensor<4xui8>) -> tensor<4xui8>
    return %2 : tensor<4xui8>
  }
  func.func private @inner(%arg0: tensor<4xui8>) -> tensor<4xui8> {
    %0 = stablehlo.custom_call @in_callee(%arg0) {mhlo.backend_config = {n = 1 : i64}, mhlo.frontend_attributes = {num_batch_dims = "1"}} : (tensor<4xui8>) -> tensor<4xui8>
    return %0 : tensor<4xui8>
  }
}
"""


SHARDY_MANUAL = """
module @m {
  sdy.mesh @mesh = <["x"=2]>
  func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"x"}]>] out_shardings=[<@mesh, [{"x"}]>] manual_axes={"x"} (%arg1: tensor<4xf32>) {
      %1 = stablehlo.custom_call @k(%arg1) {api_version = 4 : i32} : (tensor<4xf32>) -> tensor<4xf32>
      sdy.return %1 : tensor<4xf32>
    } : (tensor<8xf32>) -> tensor<8xf32>
    %2 = stablehlo.custom_call @k(%0) {api_version = 4 : i32} : (tensor<8xf32>) -> tensor<8xf32>
    return %2 : tensor<8xf32>
  }
}
"""


GSPMD_MANUAL = """
module @m {
  func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {
    %0 = stablehlo.custom_call @Sharding(%arg0) {mhlo.sharding = "{devices=[2]<=[2]}"} : (tensor<8xf32>) -> tensor<8xf32>
    %1 = stablehlo.custom_call @SPMDFullToShardShape(%0) {mhlo.sharding = "{manual}"} : (tensor<8xf32>) -> tensor<4xf32>
    %2 = func.call @shmap_body(%1) : (tensor<4xf32>) -> tensor<4xf32>
    %3 = stablehlo.custom_call @k(%arg0) {api_version = 4 : i32} : (tensor<8xf32>) -> tensor<8xf32>
    return %3 : tensor<8xf32>
  }
  func.func private @shmap_body(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @k(%arg0) {api_version = 4 : i32} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""
