# libFuzzer target for zs-server's request handling (tests/fuzz_service.c):
# built with clang by tests/fuzz_service.sh, seeded with a valid request of
# every method, run for 45 s (the suite's time). Skipped (exit 77) where clang has no libFuzzer.
# Longer: tests/fuzz_service.sh <source dir> <build dir> 3600.
add_test(NAME test_fuzz_service
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_service.sh ${PROJECT_SOURCE_DIR}
                 ${PROJECT_BINARY_DIR} 45)
set_tests_properties(test_fuzz_service PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
                                                  LABELS fuzz DEPENDS zs_proto)
