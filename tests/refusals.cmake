# Validation and refusal tests: framing (unit), the shard state machine
# (unit), and every refusal of a real zs-server over the wire (integration).
zs_add_test(test_frame SRCS test_frame.c LIBS zs_proto TIMEOUT 120 LABELS unit)
zs_add_test(test_shard SRCS test_shard.c LIBS zs_server_core TIMEOUT 120 LABELS unit)
zs_add_test(test_shard_spec SRCS test_shard_spec.c LIBS zs_server_core TIMEOUT 120 LABELS unit)
zs_add_test(test_budget SRCS test_budget.c LIBS zs_server_core TIMEOUT 30 LABELS unit)
zs_add_test(test_refusals SRCS test_refusals.c LIBS zeroshard zs_testproc TIMEOUT 180
            LABELS integration)
set_tests_properties(test_refusals PROPERTIES DEPENDS zs-server)
