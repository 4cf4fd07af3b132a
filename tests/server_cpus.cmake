# zs-server --cpus: the whole process on the listed CPUs, bad lists refused.
add_test(NAME test_server_cpus COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_server_cpus.sh
                                       $<TARGET_FILE:zs-server>)
set_tests_properties(test_server_cpus PROPERTIES TIMEOUT 60 LABELS integration)
# zs-server --listen unix:PATH: served there, named so in --ready-file.
add_test(NAME test_server_unix COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_server_unix.sh
                                       $<TARGET_FILE:zs-server> $<TARGET_FILE:zs-ctl>)
set_tests_properties(test_server_unix PROPERTIES TIMEOUT 60 LABELS integration)
