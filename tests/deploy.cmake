# Launch files in deploy/ (issue 10): Slurm on a real two-node cluster started
# by the test on this machine; the Kubernetes manifests with yamllint (and
# kubectl's client-side checks where one is installed).
add_test(NAME test_slurm
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_slurm.sh
                 $<TARGET_FILE:zs-server> $<TARGET_FILE:zs-train> $<TARGET_FILE:zs-ctl>
                 $<TARGET_FILE:zs-tokenize> ${PROJECT_SOURCE_DIR})
set_tests_properties(test_slurm PROPERTIES TIMEOUT 180 LABELS integration SKIP_RETURN_CODE 77)

add_test(NAME test_k8s
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_k8s.sh
                 $<TARGET_FILE:zs-server> $<TARGET_FILE:zs-train> $<TARGET_FILE:zs-ctl>
                 $<TARGET_FILE:zs-tokenize> ${PROJECT_SOURCE_DIR})
set_tests_properties(test_k8s PROPERTIES TIMEOUT 120 LABELS integration SKIP_RETURN_CODE 77)
