# cmake -DZERO_BUILD_DIR=build -DCONSUMERS_DIR=tests/install -DWORK_DIR=/tmp/x
#       [-DGENERATOR=Ninja] [-DC_COMPILER=cc] [-DCXX_COMPILER=c++] [-DLIBDIR=lib]
#       [-DPARTS=c;pkgconfig;cpp]
#       -P run_install_test.cmake
# Installs the build into WORK_DIR/prefix, checks the layout, then builds and runs each part:
#   c          c_consumer/ through find_package(zero CONFIG) and zero::zero_c
#   pkgconfig  c_consumer/main.c compiled with `pkg-config --cflags --libs zero`
#   cpp        cpp_consumer/ through find_package(zero CONFIG) and zero::engine
cmake_minimum_required(VERSION 3.25)
foreach(var ZERO_BUILD_DIR CONSUMERS_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_install_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED PARTS)
  set(PARTS c pkgconfig cpp)
endif()
if(NOT LIBDIR)
  set(LIBDIR lib)
endif()
if(NOT GENERATOR)
  set(GENERATOR Ninja)
endif()
if(NOT C_COMPILER)
  set(C_COMPILER cc)
endif()
if(NOT CXX_COMPILER)
  set(CXX_COMPILER c++)
endif()

# Runs a command; on failure stops with what it printed.
function(run what)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "${what} failed (${rc}):\n  ${command}\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  if(out MATCHES "consumer: ok")
    message("${out}")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
run("install into ${prefix}" ${CMAKE_COMMAND} --install ${ZERO_BUILD_DIR} --prefix ${prefix})

# The layout docs/building.md (Install) promises.
set(missing "")
foreach(path IN ITEMS
    include/zero/zero_c.h include/zero/engine.h include/zero/base/dtype.h
    include/zero/comm/communicator.h include/zero/device/device.h include/config/ds_config.h
    ${LIBDIR}/libzero.so ${LIBDIR}/libzero.so.0 ${LIBDIR}/libzero.so.0.1.0
    ${LIBDIR}/libzero_engine.a ${LIBDIR}/libzero_base.a
    ${LIBDIR}/cmake/zero/zeroConfig.cmake ${LIBDIR}/cmake/zero/zeroConfigVersion.cmake
    ${LIBDIR}/pkgconfig/zero.pc
    bin/zero-config bin/zero_to_fp32 bin/zero-train bin/zero-bench)
  if(NOT EXISTS ${prefix}/${path})
    list(APPEND missing ${path})
  endif()
endforeach()
if(NOT IS_SYMLINK ${prefix}/${LIBDIR}/libzero.so OR NOT IS_SYMLINK ${prefix}/${LIBDIR}/libzero.so.0)
  list(APPEND missing "libzero.so and libzero.so.0 as symlinks")
endif()
if(missing)
  message(FATAL_ERROR "the install into ${prefix} lacks: ${missing}")
endif()
message(STATUS "layout of ${prefix}: ok")

# Each consumer is configured with only the prefix to go on.
function(cmake_consumer name)
  set(build ${WORK_DIR}/${name})
  run("configure ${name}" ${CMAKE_COMMAND} -S ${CONSUMERS_DIR}/${name} -B ${build} -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_C_COMPILER=${C_COMPILER}
      -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release)
  run("build ${name}" ${CMAKE_COMMAND} --build ${build})
  run("run ${name}" ${build}/${name})
endfunction()

if("c" IN_LIST PARTS)
  cmake_consumer(c_consumer)
endif()

if("pkgconfig" IN_LIST PARTS)
  find_program(PKG_CONFIG NAMES pkg-config pkgconf REQUIRED)
  set(pc_env PKG_CONFIG_PATH=${prefix}/${LIBDIR}/pkgconfig)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${pc_env} ${PKG_CONFIG} --modversion zero
    OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT version STREQUAL "0.1.0")
    message(FATAL_ERROR "pkg-config --modversion zero: '${version}' (${rc}), expected 0.1.0")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${pc_env} ${PKG_CONFIG} --cflags --libs zero
    OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config --cflags --libs zero failed (${rc})")
  endif()
  message(STATUS "pkg-config --cflags --libs zero: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(exe ${WORK_DIR}/pkgconfig/c_consumer)
  file(MAKE_DIRECTORY ${WORK_DIR}/pkgconfig)
  run("build c_consumer with pkg-config" ${C_COMPILER} -std=c99 -Wall -Wextra -Wpedantic -Werror
      ${CONSUMERS_DIR}/c_consumer/main.c ${flags} -lm -o ${exe})
  run("run c_consumer built with pkg-config" ${CMAKE_COMMAND} -E env
      LD_LIBRARY_PATH=${prefix}/${LIBDIR} ${exe})
endif()

if("cpp" IN_LIST PARTS)
  cmake_consumer(cpp_consumer)
endif()

# Passed: the temporary prefix goes, so no stale copy of the tools sits in the build tree next to
# the real ones (a failed run keeps it for inspection).
file(REMOVE_RECURSE ${WORK_DIR})
