# batchpart._cuda: the cuSOLVER/cuBLAS twins of the CPU LAPACK kernels.
#
# Included from the top-level CMakeLists.txt after the CPU module is defined.
# Nothing here touches the _core target. The module is built only when
#   - BATCHPART_CUDA is AUTO (default) or ON,
#   - nvcc is found (CMAKE_CUDA_COMPILER, $CUDACXX, $CUDA_HOME/bin,
#     $CUDA_PATH/bin, /usr/local/cuda/bin, then PATH), and
#   - cuSOLVER and cuBLAS headers and shared libraries of the toolkit's major
#     version are found: in BATCHPART_CUDA_LIBS_ROOT, in pip's NVIDIA wheels
#     (nvidia-cusolver / nvidia-cublas, found through the build's Python), or
#     in the CUDA toolkit itself.
# In AUTO mode anything missing skips the module with a STATUS message; with
# ON it is a configure error; OFF skips without looking. The library search
# runs before the CUDA language is enabled, so a machine without nvcc (or
# without cuSOLVER) pays only a find_program (plus a Python query) for it.

# The default comes from the environment where BATCHPART_CUDA is set there, so
# a wheel build (cibuildwheel's CUDA variant) can choose without a -D flag.
if(DEFINED ENV{BATCHPART_CUDA} AND NOT "$ENV{BATCHPART_CUDA}" STREQUAL "")
  set(_bp_cuda_default "$ENV{BATCHPART_CUDA}")
else()
  set(_bp_cuda_default "AUTO")
endif()
set(BATCHPART_CUDA "${_bp_cuda_default}" CACHE STRING
    "Build the CUDA kernels (batchpart._cuda): AUTO (if nvcc and cuSOLVER/cuBLAS are found), ON (required) or OFF")
set_property(CACHE BATCHPART_CUDA PROPERTY STRINGS AUTO ON OFF)
set(BATCHPART_CUDA_LIBS_ROOT "$ENV{BATCHPART_CUDA_LIBS_ROOT}" CACHE PATH
    "A directory with include/ and lib/ holding cuSOLVER and cuBLAS (searched first)")

string(TOUPPER "${BATCHPART_CUDA}" _bp_cuda_mode)
if(_bp_cuda_mode STREQUAL "AUTO")
elseif(_bp_cuda_mode)  # ON, TRUE, 1, ...
  set(_bp_cuda_mode "ON")
else()
  set(_bp_cuda_mode "OFF")
endif()

# Leaves this file: a STATUS message in AUTO mode, an error with ON. The
# arguments are concatenated (so they must not contain semicolons).
macro(_bp_cuda_skip)
  string(CONCAT _bp_reason ${ARGV})
  if(_bp_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "BATCHPART_CUDA=ON, but ${_bp_reason}")
  endif()
  message(STATUS "batchpart: CUDA kernels not built (${_bp_reason}); the CPU build is "
                 "unaffected. -DBATCHPART_CUDA=ON makes this an error, OFF skips the search.")
  return()
endmacro()

if(_bp_cuda_mode STREQUAL "OFF")
  message(STATUS "batchpart: CUDA kernels not built (BATCHPART_CUDA=OFF)")
  return()
endif()

# ---- nvcc and its version ---------------------------------------------------
if(CMAKE_CUDA_COMPILER)
  set(BATCHPART_NVCC "${CMAKE_CUDA_COMPILER}")
elseif(DEFINED ENV{CUDACXX} AND EXISTS "$ENV{CUDACXX}")
  set(BATCHPART_NVCC "$ENV{CUDACXX}")
else()
  find_program(BATCHPART_NVCC nvcc
    HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
endif()
if(NOT BATCHPART_NVCC)
  _bp_cuda_skip("no nvcc found")
endif()
execute_process(COMMAND "${BATCHPART_NVCC}" --version
  OUTPUT_VARIABLE _bp_nvcc_version_text RESULT_VARIABLE _bp_nvcc_rc ERROR_QUIET)
if(NOT _bp_nvcc_rc EQUAL 0 OR NOT _bp_nvcc_version_text MATCHES "release ([0-9]+)\\.([0-9]+)")
  _bp_cuda_skip("${BATCHPART_NVCC} --version failed")
endif()
set(BATCHPART_CUDA_MAJOR "${CMAKE_MATCH_1}")
set(_bp_cuda_version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
# cuBLAS shares the toolkit's major version; cuSOLVER is one behind
# (CUDA 13: libcublas.so.13, libcusolver.so.12).
set(_bp_cublas_major "${BATCHPART_CUDA_MAJOR}")
math(EXPR _bp_cusolver_major "${BATCHPART_CUDA_MAJOR} - 1")

# ---- where cuSOLVER and cuBLAS may live -------------------------------------
# pip's NVIDIA wheels: nvidia/cu13/{include,lib} (CUDA 13), or
# nvidia/cusolver/... and nvidia/cublas/... (CUDA 12). The build's Python is
# asked twice: as it runs (a build requirement would be visible), and with -I,
# which ignores PYTHONPATH and so sees the environment the package is being
# installed into even under pip's build isolation.
set(_bp_find_wheels [=[
import importlib.util, os, sys
found = []
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        continue
    if spec is not None and spec.submodule_search_locations:
        found += [os.path.realpath(p) for p in spec.submodule_search_locations]
print(";".join(dict.fromkeys(found)))
]=])
set(_bp_wheel_modules "nvidia.cu${BATCHPART_CUDA_MAJOR}" nvidia.cusolver nvidia.cublas)
set(_bp_wheel_dirs "")
foreach(_bp_isolation "" "-I")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" ${_bp_isolation} -c "${_bp_find_wheels}" ${_bp_wheel_modules}
    OUTPUT_VARIABLE _bp_dirs OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _bp_rc ERROR_QUIET)
  if(_bp_rc EQUAL 0 AND _bp_dirs)
    list(APPEND _bp_wheel_dirs ${_bp_dirs})
  endif()
endforeach()
list(REMOVE_DUPLICATES _bp_wheel_dirs)

get_filename_component(_bp_nvcc_real "${BATCHPART_NVCC}" REALPATH)
get_filename_component(_bp_toolkit_guess "${_bp_nvcc_real}/../.." ABSOLUTE)
set(_bp_search_dirs ${BATCHPART_CUDA_LIBS_ROOT} ${_bp_wheel_dirs} ${_bp_toolkit_guess}
    "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda)
set(_bp_include_suffixes include targets/x86_64-linux/include targets/sbsa-linux/include)
set(_bp_lib_suffixes lib lib64 targets/x86_64-linux/lib targets/sbsa-linux/lib)

find_path(BATCHPART_CUSOLVER_INCLUDE_DIR cusolverDn.h
  HINTS ${_bp_search_dirs} PATH_SUFFIXES ${_bp_include_suffixes})
find_path(BATCHPART_CUBLAS_INCLUDE_DIR cublas_v2.h
  HINTS ${_bp_search_dirs} PATH_SUFFIXES ${_bp_include_suffixes})
find_library(BATCHPART_CUSOLVER_LIBRARY NAMES "libcusolver.so.${_bp_cusolver_major}" cusolver
  HINTS ${_bp_search_dirs} PATH_SUFFIXES ${_bp_lib_suffixes})
find_library(BATCHPART_CUBLAS_LIBRARY NAMES "libcublas.so.${_bp_cublas_major}" cublas
  HINTS ${_bp_search_dirs} PATH_SUFFIXES ${_bp_lib_suffixes})

set(_bp_missing "")
foreach(_bp_var BATCHPART_CUSOLVER_INCLUDE_DIR BATCHPART_CUBLAS_INCLUDE_DIR
                BATCHPART_CUSOLVER_LIBRARY BATCHPART_CUBLAS_LIBRARY)
  if(NOT ${_bp_var})
    list(APPEND _bp_missing ${_bp_var})
  endif()
endforeach()
if(_bp_missing)
  string(REPLACE ";" ", " _bp_missing "${_bp_missing}")
  _bp_cuda_skip("nvcc ${_bp_cuda_version} found, but not ${_bp_missing} (install "
                "nvidia-cusolver and nvidia-cublas with pip, or point BATCHPART_CUDA_LIBS_ROOT at them)")
endif()

# The headers must match the toolkit's major version (a CUDA 12 cuBLAS next to
# nvcc 13 would link against the wrong sonames).
function(_bp_header_major header macro out)
  file(STRINGS "${header}" _line REGEX "#[ \t]*define[ \t]+${macro}[ \t]+[0-9]+")
  if(_line MATCHES "${macro}[ \t]+([0-9]+)")
    set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()
_bp_header_major("${BATCHPART_CUBLAS_INCLUDE_DIR}/cublas_api.h" CUBLAS_VER_MAJOR _bp_found_cublas_major)
_bp_header_major("${BATCHPART_CUSOLVER_INCLUDE_DIR}/cusolver_common.h" CUSOLVER_VER_MAJOR
                 _bp_found_cusolver_major)
if(NOT _bp_found_cublas_major STREQUAL _bp_cublas_major OR
   NOT _bp_found_cusolver_major STREQUAL _bp_cusolver_major)
  _bp_cuda_skip("cuBLAS ${_bp_found_cublas_major} / cuSOLVER ${_bp_found_cusolver_major} headers "
                "(${BATCHPART_CUBLAS_INCLUDE_DIR}) do not match nvcc ${_bp_cuda_version}, which needs "
                "cuBLAS ${_bp_cublas_major} / cuSOLVER ${_bp_cusolver_major}")
endif()

# ---- the CUDA language -------------------------------------------------------
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  # SASS for every major architecture CUDA 13 supports (it runs on the minor
  # revisions of the same major), plus compute_75 PTX that the driver can JIT
  # for anything newer. The kernels here are small; this costs seconds.
  set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;90-real;100-real;120-real;75-virtual")
endif()
if(NOT CMAKE_CUDA_COMPILER)
  set(ENV{CUDACXX} "${BATCHPART_NVCC}")
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    _bp_cuda_skip("${BATCHPART_NVCC} cannot compile a CUDA test program")
  endif()
endif()
enable_language(CUDA)
find_package(CUDAToolkit)
if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cudart_static)
  _bp_cuda_skip("CMake's FindCUDAToolkit did not find the runtime next to ${CMAKE_CUDA_COMPILER}")
endif()

message(STATUS "batchpart: building the CUDA kernels (batchpart._cuda) with nvcc "
               "${CMAKE_CUDA_COMPILER_VERSION} for ${CMAKE_CUDA_ARCHITECTURES}")
message(STATUS "batchpart:   cuSOLVER ${BATCHPART_CUSOLVER_LIBRARY}")
message(STATUS "batchpart:   cuBLAS   ${BATCHPART_CUBLAS_LIBRARY}")

# Device code: a static library compiled by nvcc, linked into the module.
add_library(batchpart_cuda_device STATIC cc/cusolver/device_kernels.cu)
target_include_directories(batchpart_cuda_device PRIVATE cc)
set_target_properties(batchpart_cuda_device PROPERTIES
  CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
  POSITION_INDEPENDENT_CODE ON
  CUDA_VISIBILITY_PRESET hidden)

# Host code: the FFI handlers (calling cuSOLVER/cuBLAS and the device
# kernels) and the nanobind module. The targets' contracts and shape checks
# are batchpart_kernel_common's (cc/common/), which _core links too, so both
# platforms report the same errors.
file(GLOB BATCHPART_CUSOLVER_SOURCES CONFIGURE_DEPENDS cc/cusolver/*.cc)
nanobind_add_module(_cuda NB_STATIC NOMINSIZE STABLE_ABI ${BATCHPART_CUSOLVER_SOURCES})  # as _core
target_include_directories(_cuda PRIVATE cc ${XLA_FFI_INCLUDE_DIR}
  ${BATCHPART_CUSOLVER_INCLUDE_DIR} ${BATCHPART_CUBLAS_INCLUDE_DIR})
target_link_libraries(_cuda PRIVATE batchpart_kernel_common batchpart_cuda_device
  ${BATCHPART_CUSOLVER_LIBRARY} ${BATCHPART_CUBLAS_LIBRARY} CUDA::cudart_static)
string(REPLACE ";" "," _bp_arch_list "${CMAKE_CUDA_ARCHITECTURES}")
target_compile_definitions(_cuda PRIVATE
  BATCHPART_CUDA_ARCHITECTURES="${_bp_arch_list}")

# The module finds libcusolver/libcublas (which find their own dependencies
# through their $ORIGIN runpath) next to it in site-packages (pip's wheels),
# where they were found at build time, and through the loader's usual path.
# batchpart/_cusolver_targets.py also preloads them from the wheels.
get_filename_component(_bp_cusolver_dir "${BATCHPART_CUSOLVER_LIBRARY}" DIRECTORY)
get_filename_component(_bp_cublas_dir "${BATCHPART_CUBLAS_LIBRARY}" DIRECTORY)
set(_bp_rpath "\$ORIGIN/../nvidia/cu${BATCHPART_CUDA_MAJOR}/lib"
    "\$ORIGIN/../nvidia/cusolver/lib" "\$ORIGIN/../nvidia/cublas/lib"
    "${_bp_cusolver_dir}" "${_bp_cublas_dir}")
list(REMOVE_DUPLICATES _bp_rpath)
set_target_properties(_cuda PROPERTIES BUILD_RPATH "${_bp_rpath}" INSTALL_RPATH "${_bp_rpath}")
install(TARGETS _cuda LIBRARY DESTINATION batchpart)
