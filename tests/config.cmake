# Unit tests of the DeepSpeed configuration, LR schedules and fp16 loss
# scaling (worker/config/zs_config.c, worker/engine/zs_sched.c, zs_loss_scale.c). test_config reads
# tests/fixtures/ds_*.json (the seeds' DeepSpeed configs).
zs_add_test(test_config SRCS test_config.c LIBS zeroshard LABELS unit TIMEOUT 60)
zs_add_test(test_sched SRCS test_sched.c LIBS zeroshard LABELS unit TIMEOUT 60)
zs_add_test(test_loss_scale SRCS test_loss_scale.c LIBS zeroshard LABELS unit TIMEOUT 60)
# activation_checkpointing (issue 16): presence, cpu_checkpointing, the keys
# without effect warned once, values checked, typos refused.
zs_add_test(test_config_actckpt SRCS test_config_actckpt.c LIBS zeroshard LABELS unit TIMEOUT 60)
# The resolved configuration as zs-train shows it: the one-line summary
# (digest + keys that differ from the defaults), the digest, and our shipped
# example configs (deploy/ds_quickstart.json, the k8s ConfigMap) loading
# without a warning.
zs_add_test(test_config_print SRCS test_config_print.c LIBS zeroshard LABELS unit TIMEOUT 60)
