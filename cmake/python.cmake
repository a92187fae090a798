# The nanobind module comfuse._core (python/src/core.cpp), a thin binding over comfuse_core.
# scikit-build-core (pyproject.toml) configures with COMFUSE_PYTHON=ON and installs into the
# wheel's comfuse/ folder: the module, the kernel headers the JIT compiles against (so an
# installed package does not depend on this checkout staying where it is), and the shared
# libraries of the -dev packages that are not on the system library path (fmt, spdlog,
# xxHash: a machine that built against a private prefix, as the GPU machine does, finds them
# beside the module through $ORIGIN).
find_package(Python 3.9 COMPONENTS Interpreter Development.Module REQUIRED)
if(NOT nanobind_DIR)
  execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                  OUTPUT_VARIABLE nanobind_DIR OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
endif()
find_package(nanobind CONFIG REQUIRED)

if(NOT SKBUILD_PROJECT_VERSION)
  set(SKBUILD_PROJECT_VERSION "dev")
endif()
nanobind_add_module(_core NB_STATIC python/src/core.cpp)
target_link_libraries(_core PRIVATE comfuse_core)
# The module shares a process with torch, which loads its libraries RTLD_GLOBAL and defines
# symbols of the same names (inline templates, the static CUDA runtime's): bound to each
# other's copies, either side crashes (a segfault in lowering, free(): invalid pointer at
# torch's import). So nothing of comfuse_core or its static libraries is exported, and the
# module's references bind to its own definitions.
set_target_properties(comfuse_core _core PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
target_link_options(_core PRIVATE "LINKER:-Bsymbolic" "LINKER:--exclude-libs,ALL")
target_compile_definitions(_core PRIVATE
  COMFUSE_KERNELS_DIR="${CMAKE_SOURCE_DIR}/kernels"
  COMFUSE_CUTLASS_INCLUDE="${COMFUSE_CUTLASS_INCLUDE}"
  COMFUSE_VERSION="${SKBUILD_PROJECT_VERSION}")
# libnvrtc / libcublas come from the CUDA toolkit this was built against (torch may already
# have loaded a copy of the same soname, which the loader then reuses).
get_target_property(_nvrtc CUDA::nvrtc LOCATION)
get_filename_component(_nvrtc_dir "${_nvrtc}" REALPATH)
get_filename_component(_nvrtc_dir "${_nvrtc_dir}" DIRECTORY)
set_target_properties(_core PROPERTIES
  BUILD_RPATH "${_nvrtc_dir}"
  INSTALL_RPATH "$ORIGIN;${_nvrtc_dir};${CUDAToolkit_LIBRARY_DIR}")

set(COMFUSE_PY_DEST comfuse)
install(TARGETS _core LIBRARY DESTINATION ${COMFUSE_PY_DEST})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/kernels/comfuse DESTINATION ${COMFUSE_PY_DEST}/_kernels)

# Bundle a library under its SONAME unless it lives in a system library directory.
function(comfuse_bundle_library path)
  get_filename_component(real "${path}" REALPATH)
  get_filename_component(dir "${real}" DIRECTORY)
  if(dir MATCHES "^/(usr/)?lib(64)?(/x86_64-linux-gnu)?$")
    return()
  endif()
  execute_process(COMMAND ${CMAKE_READELF} -d "${real}" OUTPUT_VARIABLE dyn)
  string(REGEX MATCH "Library soname: \\[([^]]+)\\]" _ "${dyn}")
  set(soname "${CMAKE_MATCH_1}")
  if(NOT soname)
    get_filename_component(soname "${real}" NAME)
  endif()
  message(STATUS "comfuse: bundling ${real} as ${soname}")
  install(FILES "${real}" DESTINATION ${COMFUSE_PY_DEST} RENAME "${soname}")
endfunction()
foreach(tgt fmt::fmt spdlog::spdlog)
  get_target_property(type ${tgt} TYPE)
  if(type STREQUAL "SHARED_LIBRARY")
    get_target_property(loc ${tgt} LOCATION)
    comfuse_bundle_library("${loc}")
  endif()
endforeach()
if(XXHASH_LIBRARY MATCHES "\\.so")
  comfuse_bundle_library("${XXHASH_LIBRARY}")
endif()
