# `cmake --install build --prefix P` lays out:
#   include/          the public headers (zero/zero_c.h, zero/engine.h, ... and every header they
#                     include, by their paths in the tree)
#   lib/              libzero.so (+ .so.0, .so.0.1.0), the static libraries of the C++ API
#   lib/cmake/zero/   find_package(zero CONFIG): zero::zero_c (libzero.so, for C) and zero::engine
#                     (the static engine, for C++), with a version file
#   lib/pkgconfig/    zero.pc, for the C library
#   bin/              zero-config, zero_to_fp32, zero-train, zero-bench
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ZERO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/zero)

# --- headers -------------------------------------------------------------------------------------
# The API's entry points; everything they include from the tree (#include "...") is public too.
set(ZERO_PUBLIC_HEADER_ROOTS
  zero/zero_c.h
  zero/engine.h
  zero/base/error.h
  config/ds_config.h
  zero/comm/inproc_comm.h
  zero/comm/callback_comm.h)

# OUT: the roots and every tree header they include, transitively, as paths under the tree.
function(zero_header_closure out)
  set(pending ${ARGN})
  set(seen "")
  while(pending)
    list(POP_FRONT pending header)
    if(header IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${header})
    file(STRINGS ${PROJECT_SOURCE_DIR}/${header} includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*$" "\\1" included "${line}")
      if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${included})
        message(FATAL_ERROR "${header} includes \"${included}\", which is not in the tree")
      endif()
      list(APPEND pending ${included})
    endforeach()
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${header})
  endwhile()
  list(SORT seen)
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

zero_header_closure(ZERO_PUBLIC_HEADERS ${ZERO_PUBLIC_HEADER_ROOTS})
foreach(header IN LISTS ZERO_PUBLIC_HEADERS)
  cmake_path(GET header PARENT_PATH dir)
  install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir} COMPONENT dev)
endforeach()

# --- libraries -----------------------------------------------------------------------------------
# OUT: `target` and every zero_* target it links, transitively (private links included: a static
# library's consumer links those too).
function(zero_link_closure out target)
  set(pending ${target})
  set(seen "")
  while(pending)
    list(POP_FRONT pending t)
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(type ${t} TYPE)
    set(links "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(links ${t} LINK_LIBRARIES)
    endif()
    get_target_property(interface_links ${t} INTERFACE_LINK_LIBRARIES)
    foreach(dep IN LISTS links interface_links)
      if(dep MATCHES "^zero_" AND TARGET ${dep})
        list(APPEND pending ${dep})
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

zero_link_closure(ZERO_ENGINE_LIBRARIES zero_engine)
foreach(lib IN LISTS ZERO_ENGINE_LIBRARIES)
  # zero::engine, zero::base, zero::comm, ...
  string(REGEX REPLACE "^zero_" "" export_name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${export_name})
endforeach()
install(TARGETS ${ZERO_ENGINE_LIBRARIES}
  EXPORT zeroEngineTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set_target_properties(zero_shared PROPERTIES EXPORT_NAME zero_c)
install(TARGETS zero_shared
  EXPORT zeroCTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(EXPORT zeroCTargets NAMESPACE zero:: DESTINATION ${ZERO_INSTALL_CMAKEDIR} COMPONENT dev)
install(EXPORT zeroEngineTargets NAMESPACE zero:: DESTINATION ${ZERO_INSTALL_CMAKEDIR}
        COMPONENT dev)

# --- tools ---------------------------------------------------------------------------------------
install(TARGETS zero-config zero_to_fp32 zero-train zero-bench
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

# --- CMake package -------------------------------------------------------------------------------
# What zeroConfig.cmake must find before the engine's targets load: the packages the static
# libraries link (cmake/ZeroDependencies.cmake), as this build found them.
set(ZERO_CONFIG_ENGINE_DEPENDENCIES
    "find_dependency(Threads)\nfind_dependency(fmt)\nfind_dependency(nlohmann_json 3.10)\n"
    "find_dependency(OpenMP COMPONENTS CXX)\n")
if(ZERO_HAVE_MPI)
  # FindMPI's C component refuses a project without C enabled (a C++ consumer); zero_comm only
  # links MPI's C library, so such a project gets MPI::MPI_C as this build found it.
  string(APPEND ZERO_CONFIG_ENGINE_DEPENDENCIES
         "if(NOT TARGET MPI::MPI_C)\n"
         "  get_property(_zero_languages GLOBAL PROPERTY ENABLED_LANGUAGES)\n"
         "  if(\"C\" IN_LIST _zero_languages)\n"
         "    find_dependency(MPI COMPONENTS C)\n"
         "  else()\n"
         "    add_library(MPI::MPI_C INTERFACE IMPORTED)\n"
         "    set_target_properties(MPI::MPI_C PROPERTIES\n"
         "      INTERFACE_LINK_LIBRARIES \"${MPI_C_LIBRARIES}\")\n"
         "  endif()\n"
         "  unset(_zero_languages)\n"
         "endif()\n")
endif()
if(ZERO_HAVE_CUDA)
  # zero_device links the CUDA runtime (CudaDevice) and zero_comm NCCL by path.
  string(APPEND ZERO_CONFIG_ENGINE_DEPENDENCIES "find_dependency(CUDAToolkit)\n")
endif()
if(TARGET PkgConfig::ZERO_LIBZIP)
  string(APPEND ZERO_CONFIG_ENGINE_DEPENDENCIES
         "if(NOT TARGET PkgConfig::ZERO_LIBZIP)\n"
         "  find_dependency(PkgConfig)\n"
         "  pkg_check_modules(ZERO_LIBZIP REQUIRED QUIET IMPORTED_TARGET libzip)\n"
         "endif()\n")
endif()
string(JOIN "" ZERO_CONFIG_ENGINE_DEPENDENCIES ${ZERO_CONFIG_ENGINE_DEPENDENCIES})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/zeroConfig.cmake.in
  ${PROJECT_BINARY_DIR}/zeroConfig.cmake
  INSTALL_DESTINATION ${ZERO_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zeroConfig.cmake ${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
  DESTINATION ${ZERO_INSTALL_CMAKEDIR} COMPONENT dev)

# --- pkg-config ----------------------------------------------------------------------------------
# Relative to the .pc file, so the installed tree can move.
file(RELATIVE_PATH ZERO_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" ZERO_PC_TO_PREFIX "${ZERO_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/zero.pc.in ${PROJECT_BINARY_DIR}/zero.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/zero.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)
