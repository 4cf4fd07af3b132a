# Prometheus metrics (issue 10): the registry, its text format and its HTTP
# endpoint on 127.0.0.1 (test_metrics); a real Prometheus scraping zs-server
# and zs-train on loopback (test_prometheus; skipped, exit 77, without the
# prometheus binary).
zs_add_test(test_metrics SRCS test_metrics.c LIBS zs_metrics zs_testproc TIMEOUT 60 LABELS unit)
add_test(NAME test_prometheus
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_prometheus.sh
                 $<TARGET_FILE:zs-server> $<TARGET_FILE:zs-train> $<TARGET_FILE:zs-ctl>
                 $<TARGET_FILE:zs-tokenize>
                 ${MPIEXEC_EXECUTABLE} ${PROJECT_SOURCE_DIR})
set_tests_properties(test_prometheus PROPERTIES TIMEOUT 90 LABELS integration SKIP_RETURN_CODE 77)
