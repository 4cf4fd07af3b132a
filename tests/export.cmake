# zs-ctl export and reshard (issue 10): real zs-server processes, zs-train
# under MPI, and tests/ref/export_check.py (python3 + numpy + torch) as an
# independent safetensors reader. The exporter's manifest validator
# (tools/zs_ctl_manifest.c) is compiled in for its refusal checks.
zs_add_test(test_export SRCS test_export.c ${PROJECT_SOURCE_DIR}/tools/zs_ctl_manifest.c
            LIBS zeroshard zs_testproc TIMEOUT 900 LABELS integration)
target_include_directories(test_export PRIVATE ${PROJECT_SOURCE_DIR}/tools)
target_compile_definitions(test_export PRIVATE ZS_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                           ZS_TRAIN="$<TARGET_FILE:zs-train>"
                           ZS_TOKENIZE="$<TARGET_FILE:zs-tokenize>"
                           ZS_CTL="$<TARGET_FILE:zs-ctl>")
add_dependencies(test_export zs-train zs-tokenize zs-server zs-ctl)
