# Whole-program tests: the trainer run end to end, against PyTorch and against every bad input.
# The Python of the script tests: Debian's by default (it sees python3-torch and python3-matplotlib); a machine whose
# torch and numpy live elsewhere (a GPU machine's virtual environment) passes -DMESHTRAIN_PYTHON=... instead.
set(MESHTRAIN_PYTHON /usr/bin/python3 CACHE FILEPATH "Python interpreter for the script tests (needs torch, numpy)")
set(MT_PY ${MESHTRAIN_PYTHON})
set(MT_WORK ${CMAKE_BINARY_DIR}/test_work)

add_test(NAME pytorch_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_pytorch_parity.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR}/data/tinyshakespeare.txt ${MT_WORK}/parity)
add_test(NAME llama_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_llama_parity.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR}/data/tinyshakespeare.txt ${MT_WORK}/llama_parity)
add_test(NAME bad_inputs
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_bad_inputs.py $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR}
                 ${MT_WORK}/bad_inputs ${MPIEXEC_EXECUTABLE})
add_test(NAME default_config_converges
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_convergence.py $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR}
                 ${MT_WORK}/convergence)
# The trainer and sweep commands in README.md and docs/*.md: each point's ranks and global batch let it start.
add_test(NAME doc_commands COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_doc_commands.py ${CMAKE_SOURCE_DIR})
add_test(NAME trainer_help COMMAND $<TARGET_FILE:trainer> --help)
set_tests_properties(trainer_help PROPERTIES PASS_REGULAR_EXPRESSION "model.n_layer.*optim.lr")
set_tests_properties(pytorch_parity llama_parity bad_inputs default_config_converges PROPERTIES
                     ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 1500)
# The GPT-2 and Llama exports loaded by Hugging Face transformers (GPT2LMHeadModel, LlamaForCausalLM) give meshtrain's
# loss within 1e-5; transformers in scripts/hf_venv.sh's cached venv (made on the first run). Skipped (exit 77) where
# it cannot be installed.
add_test(NAME hf_export
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_hf_export.py $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR}
                 ${MT_WORK}/hf_export)
set_tests_properties(hf_export PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 900 SKIP_RETURN_CODE 77)

# build/sample's GPT-2 tokenizer gives Hugging Face tokenizers' ids for the same tokenizer files (tokenizers from
# scripts/hf_venv.sh's venv; skipped, exit 77, where it cannot be installed).
add_test(NAME tokenizer_hf
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_tokenizer_hf.py $<TARGET_FILE:sample> ${CMAKE_SOURCE_DIR}
                 ${MT_WORK}/tokenizer_hf)
set_tests_properties(tokenizer_hf PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77)

# build/sample: greedy decoding of a GPT-2 and a Llama export equals the PyTorch references' token for token;
# seeded draws; a GPT-2 tokenizer file; bad input.
add_test(NAME sample
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_sample.py $<TARGET_FILE:sample> $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/sample)
set_tests_properties(sample PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 300)

# Byte-level text with a separate validation file, end to end: evaluation rows carry val_loss.
add_test(NAME text_data_with_val_path
         COMMAND $<TARGET_FILE:trainer> --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --set data.source=text
                 --set data.path=${CMAKE_SOURCE_DIR}/data/tinyshakespeare.txt
                 --set data.val_path=${CMAKE_SOURCE_DIR}/data/tinyshakespeare.txt --set model.vocab_size=256
                 --set train.eval_every=5 --set train.steps=10 --set run.log_every=5
                 --set run.dir=${MT_WORK}/text_data)
set_tests_properties(text_data_with_val_path PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1"
                     PASS_REGULAR_EXPRESSION "done: 10 steps, final loss [0-9.]+, val loss [0-9.]+.*wrote")

# Data parallelism through mpirun: every layout reproduces the single-rank losses.
add_test(NAME dp_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_dp_parity.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/dp_parity)
set_tests_properties(dp_parity PROPERTIES TIMEOUT 900 PROCESSORS 2)
add_test(NAME profile_trace
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_profile_trace.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/profile_trace)
set_tests_properties(profile_trace PROPERTIES TIMEOUT 300 PROCESSORS 2)

# Energy per step from RAPL counters (a powercap folder of the test's own), and none without them.
add_test(NAME energy
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_energy.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/energy)
set_tests_properties(energy PROPERTIES TIMEOUT 120 PROCESSORS 2)

# Tensor parallelism through mpirun: tp = 2, tp = 4 and dp = 2 x tp = 2 reproduce the single-rank losses, step-1
# gradients and weights.
add_test(NAME tp_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_tp_parity.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/tp_parity)
set_tests_properties(tp_parity PROPERTIES TIMEOUT 900 PROCESSORS 2)

# Pipeline parallelism on 8 ranks: every dp x tp x pp factorization, every schedule, order strings, uneven
# stages; losses, step-1 gradients and the gathered export against the single-rank run.
add_test(NAME pp_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_pp_parity.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/pp_parity)
set_tests_properties(pp_parity PROPERTIES TIMEOUT 1200 PROCESSORS 2)
# ZeRO-2 on every mesh against one rank; its reductions per step, memory and checkpoints across stages.
add_test(NAME zero_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_zero_parity.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/zero_parity)
set_tests_properties(zero_parity PROPERTIES TIMEOUT 900 PROCESSORS 2)
# ZeRO-3 on every mesh against one rank; its gathers per step, memory, checkpoints and export.
add_test(NAME zero3_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_zero3_parity.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/zero3_parity)
set_tests_properties(zero3_parity PROPERTIES TIMEOUT 900 PROCESSORS 2)
# The flight recorder: its analyzer on synthetic dumps, and the trainer's dumps on real hangs and desyncs.
add_test(NAME flight_analyzer
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_flight.py ${CMAKE_SOURCE_DIR} ${MT_WORK}/flight_analyzer)
add_test(NAME flight_recorder
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_flight_recorder.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/flight_recorder)
set_tests_properties(flight_recorder PROPERTIES TIMEOUT 600 PROCESSORS 2)
# Context parallelism (parallel.cp) against one rank, composed with dp, ZeRO, tp and sp, pp, Llama; checkpoints.
add_test(NAME cp_parity
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_cp_parity.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/cp_parity)
set_tests_properties(cp_parity PROPERTIES TIMEOUT 600 PROCESSORS 2)
# Llama (model.arch=llama) on every mesh against one rank.
add_test(NAME llama_mesh
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_llama_mesh.py ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/llama_mesh)
set_tests_properties(llama_mesh PROPERTIES TIMEOUT 1200 PROCESSORS 2)
add_test(NAME llama_features
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_llama_features.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/llama_features)
set_tests_properties(llama_features PROPERTIES TIMEOUT 900 PROCESSORS 2)

# Mixed precision: bf16 and fp16 on one rank and bf16 (with bf16 gradient reduction) on dp2 x tp2 end within 2%
# of fp32 after 150 steps of tinyshakespeare; an injected overflow is skipped by every rank of a 2x2x2 mesh.
add_test(NAME mixed_precision_convergence
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_mixed_precision.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/mixed_precision)
add_test(NAME loss_scale_overflow
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_loss_scale_overflow.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/loss_scale_overflow)
set_tests_properties(mixed_precision_convergence loss_scale_overflow PROPERTIES TIMEOUT 900 PROCESSORS 2)

# Checkpoints: exact resume after a crash (fp32 and fp16), resharding 2x2x2 onto 1x4x2 and 4x1x1, export, every
# corrupt-checkpoint case, killed and stopped ranks, non-finite losses, pruning, weight copies that drift apart.
add_test(NAME checkpoints
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_checkpoints.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/checkpoints)
set_tests_properties(checkpoints PROPERTIES TIMEOUT 900 PROCESSORS 2)

# Runs you can trust: meta.json's own checksum, resume-key mismatches, fallback past a damaged checkpoint, the
# prune order, run.dir/status.json (and train.sbatch reading it), the run.dir lock, the activation-memory refusal.
add_test(NAME run_trust
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_run_trust.py $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR}
                 ${MT_WORK}/run_trust)
set_tests_properties(run_trust PROPERTIES TIMEOUT 120)

# run.stop_signals: SIGTERM / SIGUSR1 stop after the step in progress with a checkpoint that resumes bit-identically
# (also under optim.staleness), a second signal stops at once; a checkpoint on a full disk leaves nothing behind.
add_test(NAME stop_signals
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_stop_signals.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/stop_signals)
set_tests_properties(stop_signals PROPERTIES TIMEOUT 600 PROCESSORS 2)

# Several hosts over real TCP (scripts/cluster.sh: network namespaces on a bridge): dp, tp inside a host x dp
# across, pp across hosts against one host; bytes on the host links; hierarchical all-reduce on the real hosts;
# a checkpoint from 2 hosts resumed on 1. Skipped (exit 77) without root or `ip netns`.
add_test(NAME multihost
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_multihost.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/multihost)
set_tests_properties(multihost PROPERTIES TIMEOUT 900 PROCESSORS 2 SKIP_RETURN_CODE 77 RESOURCE_LOCK host_network)

# Network faults on 2 hosts: a link down and a host's processes killed end the job within comm.timeout_s + 15 s and
# resume bit-identically from the newest checkpoint; a 2 s link outage is ridden out. Skipped (exit 77) without root.
add_test(NAME network_faults
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_network_faults.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/network_faults)
set_tests_properties(network_faults PROPERTIES TIMEOUT 900 PROCESSORS 2 SKIP_RETURN_CODE 77 RESOURCE_LOCK host_network)

# scripts/slurm/train.sbatch without Slurm: syntax, refusals, the command built from Slurm's environment, and a real
# run through a stand-in srun, requeued once (same job id: it resumes).
add_test(NAME slurm_script
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_slurm_script.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/slurm_script)
set_tests_properties(slurm_script PROPERTIES TIMEOUT 300 PROCESSORS 2)

# The Slurm batch script on a two-node Slurm cluster in network namespaces (slurmctld, 2 slurmd, munged): a job on
# 2 nodes, a requeued job stopping with a checkpoint and resuming, and a killed rank whose survivors dump their flight
# recorders. Skipped (exit 77) without root or slurm-wlm.
add_test(NAME slurm_cluster
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_slurm_cluster.py $<TARGET_FILE:trainer>
                 ${CMAKE_SOURCE_DIR} ${MT_WORK}/slurm_cluster)
set_tests_properties(slurm_cluster PROPERTIES TIMEOUT 600 PROCESSORS 2 SKIP_RETURN_CODE 77 RESOURCE_LOCK host_network)

# comm.thread_priority: real-time communication threads where permitted, a clear refusal where required and denied.
add_test(NAME thread_priority
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_thread_priority.py ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:trainer> ${CMAKE_SOURCE_DIR} ${MT_WORK}/thread_priority)
set_tests_properties(thread_priority PROPERTIES TIMEOUT 300 PROCESSORS 2)

# Test processes remove their scratch directories (tests/test_support.h, scratch_dir) when they exit: two suites
# that write files run with a fresh TMPDIR, which must be empty afterwards.
add_test(NAME scratch_cleanup
         COMMAND bash -c "d=$(mktemp -d) && TMPDIR=$d \"$0\" > /dev/null && TMPDIR=$d \"$1\" > /dev/null && left=$(ls -A $d) && rmdir $d && [ -z \"$left\" ] || { echo \"left in $d: $left\"; exit 1; }"
                 $<TARGET_FILE:test_config> $<TARGET_FILE:test_data>)

# The benchmarks refuse a bad command line with exit 2 and a message (bench/bench_args.h, bench/bench_cli.py),
# nothing timed.
add_test(NAME bench_args
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/tests/py/test_bench_args.py ${MPIEXEC_EXECUTABLE}
                 ${CMAKE_BINARY_DIR}/bench)
set_tests_properties(bench_args PROPERTIES TIMEOUT 300 PROCESSORS 2)
# Random whole runs (scripts/random_runs.py): ten seeded draws, two per property (exit status, losses of a mesh
# against one rank's, a checkpoint resumed, a run stopped by SIGTERM and resumed, sampling split against one process:
# build/sample, beside the trainer); campaigns of hundreds are run by hand (docs/reliability.md, "Random whole runs").
add_test(NAME random_runs
         COMMAND ${MT_PY} ${CMAKE_SOURCE_DIR}/scripts/random_runs.py --runs 10 --seed 3 --trainer $<TARGET_FILE:trainer>
                 --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --mpiexec ${MPIEXEC_EXECUTABLE}
                 --out ${MT_WORK}/random_runs)
set_tests_properties(random_runs PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1" TIMEOUT 600)
