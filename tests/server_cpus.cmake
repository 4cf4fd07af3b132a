# zs-server --cpus: the whole process on the listed CPUs, bad lists refused.
add_test(NAME test_server_cpus COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_server_cpus.sh
                                       $<TARGET_FILE:zs-server>)
set_tests_properties(test_server_cpus PROPERTIES TIMEOUT 60 LABELS integration)
