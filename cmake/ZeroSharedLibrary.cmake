# libzero.so (target zero_shared): the C ABI (zero/zero_c.h) over the whole engine, for C, Python
# (ctypes) and other languages. Exports zero_* and nothing else:
#   * every static library is compiled -fvisibility=hidden (the project default, CMakeLists.txt);
#   * --exclude-libs,ALL keeps whatever the static archives define out of the dynamic symbol table;
#   * the version script (zero.map) makes everything but zero_* local.
# --exclude-libs hides an archive member's symbols even when the version script names them, so the
# C ABI cannot come from libzero_engine.a: its sources are compiled a second time here, as this
# library's own objects, with default visibility (zero_c.h carries no export attribute).
include_guard(GLOBAL)

# The C ABI sources are those of zero_engine under zero/ named zero_c*.cpp or in zero/c/.
get_target_property(_zero_engine_sources zero_engine SOURCES)
get_target_property(_zero_engine_dir zero_engine SOURCE_DIR)
set(ZERO_C_ABI_SOURCES "")
foreach(src IN LISTS _zero_engine_sources)
  if(src MATCHES "^\\$<")
    continue()
  endif()
  cmake_path(ABSOLUTE_PATH src BASE_DIRECTORY ${_zero_engine_dir} NORMALIZE OUTPUT_VARIABLE abs)
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${abs})
  if(rel MATCHES "^zero/(zero_c[^/]*|c/[^/]+)\\.(cpp|cc|c)$")
    list(APPEND ZERO_C_ABI_SOURCES ${abs})
  endif()
endforeach()
if(NOT ZERO_C_ABI_SOURCES)
  message(FATAL_ERROR "libzero.so: found no C ABI sources (zero/zero_c*.cpp or zero/c/*.cpp) among "
                      "zero_engine's sources; cmake/ZeroSharedLibrary.cmake looks for them there")
endif()

add_library(zero_shared SHARED ${ZERO_C_ABI_SOURCES})
# Per-source settings made where zero_engine was created apply here too.
foreach(src IN LISTS ZERO_C_ABI_SOURCES)
  foreach(prop COMPILE_DEFINITIONS COMPILE_OPTIONS INCLUDE_DIRECTORIES)
    get_source_file_property(_value ${src} TARGET_DIRECTORY zero_engine ${prop})
    if(_value)
      set_property(SOURCE ${src} APPEND PROPERTY ${prop} ${_value})
    endif()
  endforeach()
endforeach()
target_link_libraries(zero_shared PRIVATE zero_engine)
target_link_options(zero_shared PRIVATE
  "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/zero.map"
  "LINKER:--exclude-libs,ALL"
  "LINKER:--no-undefined")
set_target_properties(zero_shared PROPERTIES
  OUTPUT_NAME zero
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  CXX_VISIBILITY_PRESET default
  LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/zero.map)
zero_target_defaults(zero_shared)
