# Warnings on and clean; the host never contracts a*b+c into an FMA behind our back, so the CPU
# path can be compared bitwise with itself and with the CUDA path built with --fmad=false.
set(ZERO_CXX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-unknown-pragmas)
if(ZERO_WERROR)
  list(APPEND ZERO_CXX_WARNINGS -Werror)
endif()

function(zero_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${ZERO_CXX_WARNINGS} -ffp-contract=off>
    $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -Xcompiler=-Wall,-Wextra>)
endfunction()
