"""A Spark standalone cluster on this machine (a master and N workers, each a JVM of its own, bound to
127.0.0.1, started from the jars pyspark's pip package carries): to try ``tern fleet run --master`` on
one host, and for the test that runs a fleet in slices on two workers.

    python -m ternlab.fleet.standalone --workers 2 -- fleet run scenarios/spread.toml --seed 1

runs the tern command after ``--`` with ``--master spark://127.0.0.1:PORT`` and the confs that keep the
driver on 127.0.0.1, then stops the cluster. The JVMs are C1-only with a serial GC: they start in
seconds on a busy 2-core machine, and a fleet's Spark job does no heavy computing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..brokers.mosquitto import free_port, wait_port

QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def driver_confs() -> list[str]:
    """`tern fleet run` flags for a driver of this cluster: on 127.0.0.1, quick JVMs."""
    out = []
    for kv in ("spark.driver.host=127.0.0.1", "spark.driver.bindAddress=127.0.0.1",
               f"spark.driver.extraJavaOptions={QUICK_JVM}", f"spark.executor.extraJavaOptions={QUICK_JVM}",
               "spark.executor.memory=512m"):
        out += ["--conf", kv]
    return out


class Standalone:
    """Master and workers (one core each) on 127.0.0.1 with free ports; logs and work dirs under root.
    stop() ends the JVMs this object started (workers first)."""

    def __init__(self, root: str | os.PathLike, workers: int = 2, timeout: float = 90.0):
        self.root = Path(root)
        self.port = free_port()
        self.procs = []
        self.env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                        SPARK_NO_DAEMONIZE="1", PYSPARK_PYTHON=sys.executable, SPARK_DAEMON_MEMORY="256m",
                        SPARK_DAEMON_JAVA_OPTS=QUICK_JVM)
        self.master = f"spark://127.0.0.1:{self.port}"
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._launch(workers, timeout)
        except BaseException:
            self.stop()
            raise

    def _launch(self, workers, timeout):
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(free_port())])
        if not wait_port("127.0.0.1", self.port, timeout):
            raise RuntimeError(f"the Spark master did not listen: {self.log('master')[-2000:]}")
        for i in range(workers):
            self.workdir(i).mkdir(parents=True, exist_ok=True)
            self._start(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", self.master, "--host", "127.0.0.1",
                                        "--port", str(free_port()), "--webui-port", str(free_port()),
                                        "--cores", "1", "--memory", "1g", "--work-dir", str(self.workdir(i))])
        deadline = time.monotonic() + timeout
        while self.log("master").count("Registering worker") < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not register: {self.log('master')[-2000:]}")
            time.sleep(0.2)

    def workdir(self, i: int) -> Path:
        return self.root / f"worker-{i}-work"

    def log(self, name: str) -> str:
        p = self.root / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def _start(self, name, args):
        with open(self.root / f"{name}.log", "w") as log:
            self.procs.append(subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=self.env,
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self):
        for p in reversed(self.procs):  # workers first, then the master
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ternlab.fleet.standalone", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="logs and work dirs (default: a temporary directory, kept)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then a tern command (e.g. fleet run ...)")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    root = Path(a.dir or tempfile.mkdtemp(prefix="tern-spark-"))
    with Standalone(root, a.workers) as c:
        print(f"Spark standalone {c.master}: {a.workers} workers, logs in {root}", flush=True)
        if not cmd:
            return 0
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
        return subprocess.call([sys.executable, "-m", "ternlab.cli", *cmd, "--master", c.master, *driver_confs()],
                               env=env)


if __name__ == "__main__":
    sys.exit(main())
