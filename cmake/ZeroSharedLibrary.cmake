# libzero.so (target zero_shared): the C ABI (zero/zero_c.h; the library zero_c_abi in zero/c/)
# over the whole engine, for C, Python (ctypes) and other languages. Exports zero_* and nothing
# else:
#   * every static library is compiled -fvisibility=hidden (the project default, CMakeLists.txt);
#   * --exclude-libs,ALL keeps whatever the static archives define out of the dynamic symbol table;
#   * the version script (zero.map) makes everything but zero_* local.
# --exclude-libs hides an archive member's symbols even when the version script names them, so the
# C ABI enters the link as zero_c_abi's object files rather than as members of its archive, and
# those objects are compiled with default visibility (zero_c.h carries no export attribute).
include_guard(GLOBAL)

if(NOT TARGET zero_c_abi)
  message(FATAL_ERROR "libzero.so is linked from the C ABI library zero_c_abi (zero/c/), which "
                      "this tree does not define")
endif()
set_target_properties(zero_c_abi PROPERTIES CXX_VISIBILITY_PRESET default)

add_library(zero_shared SHARED $<TARGET_OBJECTS:zero_c_abi>)
# zero_c_abi's archive brings what its objects link; its own members are never pulled in again.
target_link_libraries(zero_shared PRIVATE zero_c_abi)
target_link_options(zero_shared PRIVATE
  "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/zero.map"
  "LINKER:--exclude-libs,ALL"
  "LINKER:--no-undefined")
set_target_properties(zero_shared PROPERTIES
  OUTPUT_NAME zero
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LINKER_LANGUAGE CXX
  LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/zero.map)
