"""scripts/slurm/train.sbatch without a Slurm cluster: its syntax, its refusals, the command it builds from Slurm's
environment, and a real run through a stand-in `srun` (which starts the ranks with mpiexec), submitted twice with the
same job id as a requeued job is: the second continues from the first one's checkpoint.

usage: test_slurm_script.py MPIEXEC TRAINER SOURCE_DIR WORK_DIR"""
import os
import shutil
import stat
import subprocess
import sys

mpiexec, trainer, src, work = sys.argv[1:5]
script = os.path.join(src, "scripts", "slurm", "train.sbatch")
config = os.path.join(src, "configs", "tiny.yaml")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
ok = True


def check(cond, what):
    global ok
    ok &= bool(cond)
    print(f"{'ok  ' if cond else 'FAIL'} {what}", flush=True)


def sbatch(env, *args):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(env)
    r = subprocess.run(["bash", script] + list(args), capture_output=True, text=True, env=e, cwd=work, timeout=300)
    return r.returncode, r.stdout + r.stderr


check(subprocess.run(["bash", "-n", script]).returncode == 0, "bash -n: the script parses")
status, out = sbatch({"CONFIG": config, "TRAINER": trainer})
check(status == 2 and "not inside a Slurm allocation" in out, f"outside an allocation: exit {status}, says why")
slurm = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
         "SLURM_CPUS_PER_TASK": "2", "CONFIG": config, "TRAINER": trainer, "RUN_ROOT": f"{work}/runs"}
status, out = sbatch(dict(slurm, CONFIG="missing.yaml"))
check(status == 2 and "no config file 'missing.yaml'" in out, f"a missing config: exit {status}, names it")
status, out = sbatch(dict(slurm, MESHTRAIN_DRY_RUN="1"), "--set", "train.steps=3")
check(status == 0 and f"OMP_NUM_THREADS=2 srun --kill-on-bad-exit=1 {trainer} --config {config} --set "
      f"run.dir={work}/runs/42 --set run.resume=auto --set train.steps=3" in out,
      "the command: srun, threads from SLURM_CPUS_PER_TASK, run.dir under the job id, resume auto, the user's --set")

# A stand-in srun: drops its own options and starts SLURM_NTASKS ranks with mpiexec.
fake = os.path.join(work, "bin", "srun")
os.makedirs(os.path.dirname(fake))
with open(fake, "w") as f:
    f.write(f'#!/bin/sh\nwhile [ "${{1#-}}" != "$1" ]; do shift; done\nexec {mpiexec} -n "$SLURM_NTASKS" "$@"\n')
os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
slurm["PATH"] = os.path.dirname(fake) + ":" + os.environ["PATH"]
sets = ["--set", "train.global_batch=8", "--set", "run.checkpoint_every=4", "--set", "run.log_every=100"]
status, out = sbatch(slurm, *sets, "--set", "train.steps=8")
check(status == 0 and "done: 8 steps" in out and os.path.exists(f"{work}/runs/42/checkpoints/step_00000008/COMPLETE"),
      f"a run through srun: exit {status}, checkpoints under runs/<job id>")
status, out = sbatch(dict(slurm, SLURM_RESTART_COUNT="1"), *sets, "--set", "train.steps=12")
check(status == 0 and "restart 1" in out and "resumed from" in out and "(from step 9)" in out,
      "requeued (same job id): continues from the checkpoint of step 8")
sys.exit(0 if ok else 1)
