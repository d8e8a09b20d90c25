"""Every jax and jaxlib internal batchpart uses, one module per concern.

The rest of batchpart reads them as ``from batchpart import _compat as
compat`` and never imports ``jax._src`` itself; this package re-exports,
by name, what each concern module offers. Each module states the jax
versions it was checked against and holds its own version branches.
``versions.check_versions`` runs first, before any of them touches jax: jax
or jaxlib older than the oldest supported raises ImportError naming the
versions; a jax newer than the newest checked warns.

- ``primitives``: primitives, avals, effects and rule tables.
- ``jaxprs``: evaluating a jaxpr again (the decorator's rewrite).
- ``ffi``: ``jax.ffi.ffi_call``'s helpers and XLA's FFI handler registry.
- ``lowering``: MLIR, lowering rules and the Shardy rule builder.
- ``partitioner``: partitioner registration, ``HloSharding``, whether XLA
  partitions the op being lowered.
- ``callbacks``: host callbacks.
- ``context``: the partitioner option, the context mesh (Explicit mode),
  the declarations snapshot in jax's cache keys.
- ``export``: ``jax.export``'s artifact lowering and safety check.
"""

from batchpart._compat.versions import check_versions as check_versions

check_versions()

from batchpart._compat.callbacks import (  # noqa: E402
  HOST_ARRAY_ALIGNMENT as HOST_ARRAY_ALIGNMENT,
  add_host_callback as add_host_callback,
  buffer_callback_target as buffer_callback_target,
  callback_cpu_device as callback_cpu_device,
  canonicalize_value as canonicalize_value,
  check_result_shape_dtype as check_result_shape_dtype,
  host_callback_target as host_callback_target,
  import_host_array as import_host_array,
  io_effect as io_effect,
  jax_callback_function as jax_callback_function,
  jax_callback_primitives as jax_callback_primitives,
  jax_callback_scope as jax_callback_scope,
  register_uncached_lowering as register_uncached_lowering,
  require_devices_during_lowering as require_devices_during_lowering,
)
from batchpart._compat.context import (  # noqa: E402
  auto_insert_reshard as auto_insert_reshard,
  declarations_key as declarations_key,
  get_cur_mesh_sharding as get_cur_mesh_sharding,
  set_declarations_key as set_declarations_key,
  use_shardy as use_shardy,
  without_mesh as without_mesh,
)
from batchpart._compat.export import (  # noqa: E402
  after_exported_call_lowering as after_exported_call_lowering,
  custom_call_check as custom_call_check,
  disabled_custom_call_target as disabled_custom_call_target,
  extend_export_safety_checks as extend_export_safety_checks,
  lowering_for_export as lowering_for_export,
  refined_module_text as refined_module_text,
  stable_custom_call_targets as stable_custom_call_targets,
)
from batchpart._compat.ffi import (  # noqa: E402
  check_compatible_avals as check_compatible_avals,
  convert_layout_for_lowering as convert_layout_for_lowering,
  convert_layouts_for_ffi_call as convert_layouts_for_ffi_call,
  ffi_effect as ffi_effect,
  handler_api as handler_api,
  jax_ffi_call_p as jax_ffi_call_p,
  note_registered as note_registered,
  platforms_with_handler as platforms_with_handler,
  result_avals_from_shape_dtypes as result_avals_from_shape_dtypes,
  unwrap_kwargs_hashable as unwrap_kwargs_hashable,
  wrap_kwargs_hashable as wrap_kwargs_hashable,
  xla_platform_name as xla_platform_name,
)
from batchpart._compat.jaxprs import (  # noqa: E402
  bind_custom_derivative_call as bind_custom_derivative_call,
  bind_custom_vmap_call as bind_custom_vmap_call,
  bind_eqn as bind_eqn,
  called_jaxpr as called_jaxpr,
  eqn_context as eqn_context,
  inlinable_jaxpr as inlinable_jaxpr,
  is_custom_derivative_call as is_custom_derivative_call,
  is_custom_vmap_call as is_custom_vmap_call,
  jaxprs_in_eqn as jaxprs_in_eqn,
)
from batchpart._compat.lowering import (  # noqa: E402
  COLLECTIVE_CHANNEL_ID as COLLECTIVE_CHANNEL_ID,
  DEVICE_TO_DEVICE_TYPE as DEVICE_TO_DEVICE_TYPE,
  aval_to_ir_type as aval_to_ir_type,
  custom_call as custom_call,
  dtype_to_ir_type as dtype_to_ir_type,
  func_dialect as func_dialect,
  hlo as hlo,
  ir as ir,
  ir_attribute as ir_attribute,
  ir_constant as ir_constant,
  lower_fun as lower_fun,
  lowering_platforms as lowering_platforms,
  make_ir_context as make_ir_context,
  module_to_bytecode as module_to_bytecode,
  module_to_string as module_to_string,
  register_lowering as register_lowering,
  sdy_sharding_rule as sdy_sharding_rule,
  wrap_lowering_rules as wrap_lowering_rules,
)
from batchpart._compat.partitioner import (  # noqa: E402
  HloSharding as HloSharding,
  OpShardingType as OpShardingType,
  is_partially_manual_lowering as is_partially_manual_lowering,
  num_partitions as num_partitions,
  register_partitioner as register_partitioner,
  xla_client as xla_client,
  xla_partitions as xla_partitions,
)
from batchpart._compat.primitives import (  # noqa: E402
  Literal as Literal,
  Primitive as Primitive,
  ShapedArray as ShapedArray,
  Tracer as Tracer,
  abstract_token as abstract_token,
  moveaxis as moveaxis,
  no_effects as no_effects,
  primitive_batchers as primitive_batchers,
  primitive_jvps as primitive_jvps,
  primitive_transposes as primitive_transposes,
  simple_impl as simple_impl,
  standard_vma_rule as standard_vma_rule,
  typeof as typeof,
  wrap_abstract_eval as wrap_abstract_eval,
  wrap_batching_rule as wrap_batching_rule,
)
