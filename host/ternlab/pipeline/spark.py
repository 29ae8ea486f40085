"""Building the SparkSession (after checking Java) and small Hadoop-filesystem helpers.

Paths are Hadoop path strings (``/data/landing``, ``file:///...``, ``hdfs://...``, ``s3a://...``); only
paths without a scheme (or with ``file:``) are checked locally before Spark starts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

MIN_JAVA = 17


class PipelineError(Exception):
    """Bad input or environment; the message is one line that says what was wrong."""


class JavaError(PipelineError):
    """No usable Java for PySpark."""


def _java_binary() -> tuple[str | None, str]:
    """The java PySpark would launch (``$JAVA_HOME/bin/java`` first, else ``java`` on PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        cand = os.path.join(home, "bin", "java")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand, f"JAVA_HOME={home}"
        return None, f"no bin/java under JAVA_HOME={home}"
    found = shutil.which("java")
    if found:
        return found, found
    return None, "no java on PATH and JAVA_HOME is not set"


def java_version(java: str) -> int | None:
    """The major version of a java binary (8 for ``1.8.0_392``, 17 for ``17.0.15``), or None."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    if major == 1 and m.group(2):
        major = int(m.group(2))
    return major


def check_java() -> str:
    """Return the java binary PySpark will use; raise JavaError unless it is Java 17 or newer."""
    java, where = _java_binary()
    if java is None:
        raise JavaError(f"Java {MIN_JAVA} or newer is needed for PySpark; found none ({where})")
    major = java_version(java)
    if major is None:
        raise JavaError(f"Java {MIN_JAVA} or newer is needed for PySpark; found {java} but could not "
                        "read its version (java -version failed)")
    if major < MIN_JAVA:
        raise JavaError(f"Java {MIN_JAVA} or newer is needed for PySpark; found Java {major} ({where})")
    return java


def parse_confs(pairs) -> dict[str, str]:
    """``["k=v", ...]`` -> dict; a pair without ``=`` or with an empty key is a PipelineError."""
    out = {}
    for p in pairs or ():
        k, sep, v = p.partition("=")
        if not sep or not k.strip():
            raise PipelineError(f"--conf expects key=value, got {p!r}")
        out[k.strip()] = v
    return out


# Spark's master URL forms; anything else makes the JVM exit before PySpark can say why
_MASTER = re.compile(r"^(?:local(?:\[(?:\*|[1-9]\d*)(?:,[1-9]\d*)?\])?|local-cluster\[\d+,\d+,\d+\]"
                     r"|yarn|spark://\S+|k8s://\S+)$")


def check_master(master: str | None) -> None:
    """Fail before Spark starts for a master URL Spark cannot parse (Spark's own failure is a JVM
    that exits with a Python traceback about the Java gateway, not naming the option)."""
    if master is not None and not _MASTER.match(master):
        raise PipelineError(f"--master {master!r} is not a Spark master URL: local, local[N], "
                            "local[*], spark://HOST:PORT, yarn or k8s://HOST:PORT")


_ERROR_CLASS = re.compile(r"\[[A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*\] .*")


def spark_error_line(e: BaseException) -> str:
    """One line for a failed Spark call: the first Spark error-class message (which names the file or
    column for read errors) and the root cause, instead of py4j's "An error occurred while calling
    o123.parquet." that says nothing."""
    text = str(e)
    lines = text.splitlines()
    head = next((m.group(0) for m in map(_ERROR_CLASS.search, lines) if m), None)
    cause = next((ln[len("Caused by: "):] for ln in reversed(lines) if ln.startswith("Caused by: ")),
                 None)
    if head is None:
        head = next((ln.lstrip(": ").strip() for ln in lines
                     if ln.strip() and not ln.startswith("An error occurred while calling")
                     and not ln.startswith(("\tat ", "\t..."))), "") or type(e).__name__
    head = re.sub(r"\s*SQLSTATE: \w+\s*$", "", head).strip()
    if cause:
        cls, sep, msg = cause.partition(": ")
        cause = f"{cls.rsplit('.', 1)[-1]}: {msg}" if sep else cls.rsplit(".", 1)[-1]
        if msg not in head:
            head += f" ({cause})"
    return head


LOOPBACK = "127.0.0.1"


def _conf_master() -> str | None:
    """The master spark-submit would take when none is given: ``--master`` of PYSPARK_SUBMIT_ARGS,
    else ``spark.master`` of spark-defaults.conf (SPARK_CONF_DIR, else SPARK_HOME/conf)."""
    import shlex

    args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    for i, a in enumerate(args):
        if a == "--master" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--master="):
            return a.split("=", 1)[1]
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = os.environ.get("SPARK_HOME")
        if not home:
            import pyspark

            home = os.path.dirname(pyspark.__file__)
        conf_dir = os.path.join(home, "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf")) as f:
            for line in f:
                parts = line.split(None, 1)
                if len(parts) == 2 and parts[0] == "spark.master":
                    return parts[1].strip()
    except OSError:
        pass
    return None


def is_local_master(master: str | None) -> bool:
    """True when the job runs in this process's JVM (``local``, ``local[N]``, no master at all)."""
    m = master or _conf_master() or "local[*]"
    return m.startswith("local")


def loopback_confs(master: str | None) -> dict[str, str]:
    """For a local master, the driver binds to and announces 127.0.0.1 (nothing listens on the host's
    network interfaces, and Spark does not warn that it picked eth0); for a cluster master nothing: the
    executors must reach the driver, so ``spark.driver.host`` is the user's to set (docs/pipeline.md)."""
    if not is_local_master(master):
        return {}
    return {"spark.driver.bindAddress": LOOPBACK, "spark.driver.host": LOOPBACK}


def _launch_jvm(app_name: str, master: str | None, confs: dict, log_path: str) -> None:
    """Start PySpark's JVM with its stdout and stderr going to ``log_path`` (appended) instead of this
    process's terminal, where its lines would land inside a live view. The SparkSession built next
    uses this JVM."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf().setAppName(app_name)
    if master:
        conf.setMaster(master)
    for k, v in confs.items():
        conf.set(k, v)
    log = open(log_path, "ab")
    try:
        SparkContext._ensure_initialized(
            gateway=launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log}))
    finally:
        log.close()  # the JVM holds its own descriptor


def build_session(app_name: str = "tern", master: str | None = None, confs: dict | None = None,
                  jvm_log: str | None = None):
    """Check Java, then get or create a SparkSession.

    Defaults: the master of ``spark-defaults.conf`` (or ``spark-submit --master``), else ``local[*]``;
    session time zone UTC (landing partitions and windows are UTC), no progress
    bars on the console, log level WARN; with a local master the driver on 127.0.0.1
    (``loopback_confs``). ``confs`` are applied last, so they override the defaults. ``jvm_log``: a
    file for the JVM's own output (its warnings, log4j's console lines) when this call starts the JVM.
    If a session is already running in this process (tests, notebooks) it is returned as is.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    check_master(master)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    # SPARK_LOCAL_IP, when set, is the user's choice and wins over the loopback defaults
    local = not os.environ.get("SPARK_LOCAL_IP") and is_local_master(master)
    defaults = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        **(loopback_confs(master) if local else {}),
    }
    settings = {**defaults, **(confs or {})}
    b = SparkSession.builder.appName(app_name)
    if master:  # else spark-defaults.conf or spark-submit --master decide, and local[*] without them
        b = b.master(master)
    for k, v in settings.items():
        b = b.config(k, v)
    starting = SparkContext._gateway is None
    if local and starting:
        # the JVM works out its address when it starts, before any conf is read, and warns when the
        # host name resolves to loopback but an interface (eth0) is picked instead; it inherits this
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    try:
        if jvm_log and starting:
            _launch_jvm(app_name, master, settings, jvm_log)
        spark = b.getOrCreate()
    finally:
        if local and starting:
            os.environ.pop("SPARK_LOCAL_IP", None)
    spark.sparkContext.setLogLevel("WARN")
    return spark


class SparkJob:
    """The Spark session of one pipeline command (``tern audit``, ``rollup``, ``report``, and whatever
    else runs a job for a user), with everything Spark prints kept off the terminal.

    The JVM's stdout and stderr (its warnings, log4j's console lines, task failures) go to ``log``
    (appended), or, without one, to a temporary file that :meth:`stop` removes unless the job
    ``failed`` -- then the file stays, for the error line to name. A session already running in this
    process (tests, notebooks) is used as it is and left running."""

    def __init__(self, app_name: str, master: str | None = None, confs: dict | None = None,
                 log: str | None = None):
        check_master(master)
        self.app_name, self.master, self.confs = app_name, master, confs or {}
        self.temporary = log is None
        if log is None:
            import tempfile

            fd, log = tempfile.mkstemp(prefix=f"{app_name}-", suffix=".spark.log")
            os.close(fd)
        self.log = log
        self.failed = False
        self.spark = None
        self.owned = False

    def start(self):
        from pyspark import SparkContext

        # Whether a session already runs in this process, whichever thread made it: the active session
        # is per thread, and taking a test's or notebook's session for ours stopped it under them.
        self.owned = SparkContext._active_spark_context is None
        self.spark = build_session(self.app_name, self.master, self.confs, jvm_log=self.log)
        return self.spark

    @property
    def jvm_log(self) -> str | None:
        """The file this job's JVM writes to (None: a session that was already running)."""
        return self.log if self.owned else None

    def stop(self) -> None:
        if self.spark is not None and self.owned:
            self.spark.stop()
            self.spark = None
        if self.temporary and not (self.failed and self.owned):
            try:
                os.unlink(self.log)
            except OSError:
                pass


# --- paths ------------------------------------------------------------------------------------------

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def is_local(path: str) -> bool:
    """True for plain paths and ``file:`` URIs (checked with os.path before Spark starts)."""
    return not _SCHEME.match(path) or path.startswith("file:")


def local_part(path: str) -> str:
    if path.startswith("file://"):
        return path[len("file://"):]
    if path.startswith("file:"):
        return path[len("file:"):]
    return path


def check_local_input(path: str, what: str) -> None:
    """Fail early (before Spark starts) for a local input path that does not exist."""
    if is_local(path) and not os.path.exists(local_part(path)):
        raise PipelineError(f"{what} not found: {path}")


def join(base: str, *parts: str) -> str:
    """Join Hadoop path strings with '/' (no pathlib: keeps schemes like hdfs:// intact)."""
    out = base.rstrip("/")
    for p in parts:
        out += "/" + p.strip("/")
    return out


def _fs(spark, path: str):
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), p


def path_exists(spark, path: str) -> bool:
    fs, p = _fs(spark, path)
    return bool(fs.exists(p))


def glob_paths(spark, pattern: str) -> list[str]:
    """Paths matching a Hadoop glob pattern (empty list when none)."""
    fs, p = _fs(spark, pattern)
    found = fs.globStatus(p)
    return [] if found is None else sorted(str(st.getPath().toString()) for st in found)


def glob_count(spark, pattern: str) -> int:
    return len(glob_paths(spark, pattern))


def write_bytes(spark, path: str, data: bytes) -> None:
    """Write (overwrite) a small file through the Hadoop FileSystem of ``path``."""
    fs, p = _fs(spark, path)
    fs.setWriteChecksum(False)  # no .crc side files beside index.html and the plots
    out = fs.create(p, True)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def read_bytes(spark, path: str) -> bytes:
    """Read a small file through the Hadoop FileSystem of ``path``."""
    fs, p = _fs(spark, path)
    if not fs.exists(p):
        raise PipelineError(f"not found: {path}")
    jvm = spark.sparkContext._jvm
    stream = fs.open(p)
    try:
        buf = jvm.java.io.ByteArrayOutputStream()
        jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, buf, 65536, False)
        return bytes(buf.toByteArray())
    finally:
        stream.close()
