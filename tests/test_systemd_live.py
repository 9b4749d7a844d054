"""The units under a real systemd: a Debian container booted with systemd-nspawn (tests/nspawn_util.py),
the units installed by systemd/setup.sh as install.sh does, the daemon on the tiny test model (CPU).

Checks READY/STATUS, the group-only socket, an inbox job of a group member, reload, watchdog restart,
socket activation, a quick clean stop, the per-accelerator template and the `systemd-analyze security`
score; an admin's day: an upgrade (setup.sh over the running install: the service restarted, or told to be;
no file the installer did not make re-owned), starts that cannot succeed (exit 78, not retried, one line saying
what to fix) and a failed job at priority err. Needs root,
systemd-nspawn and debootstrap (.ci/run installs them); skips with the reason elsewhere. The first run
builds the container root (about 1-2 minutes), later runs reuse it.
"""
from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

import daemon_util
import nspawn_util
from appliance.client import ANSWER_S
from nspawn_util import ROOT, Container, Unavailable

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

SERVICE, INSTANCE = "tts-appliance.service", "tts-appliance@0.service"
API = "/run/tts-appliance/api.sock"
OUTSIDER = (4242, [4242])  # not in group tts-appliance
TEST_CONFIG = """\
model: {threads: 1, max_frames: 200}
jobs: {watch_quiet_s: 0.5, guard: false}  # random weights: no sensible audio length
# the admin's stop timeout: no unit overrides it, and the daemon stretches TimeoutStopSec=90 to fit it
service: {status_interval_s: 0.5, stop_timeout_s: 85}
"""
# GET over the Unix socket as some user; prints {"status": ..., "body": ...} or {"errno": ...}
CLIENT = r"""
import json, socket, sys
path, url, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(timeout)
try:
    s.connect(path)
except OSError as exc:
    sys.exit(print(json.dumps({"errno": exc.errno, "error": str(exc)})))
s.sendall(f"GET {url} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, body = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": body.decode(errors="replace")}))
"""


@pytest.fixture(scope="module")
def box():
    reason = nspawn_util.skip_reason() or daemon_util.skip_reason()
    if reason:
        pytest.skip(reason)
    binds = nspawn_util.binds()
    try:
        with Container(nspawn_util.rootfs(), binds) as c:
            _install(c, nspawn_util.interpreter()[0], binds)
            yield c
    except Unavailable as exc:
        pytest.skip(f"container: {exc}")


def _install(c: Container, venv, binds) -> None:
    # the bind mounts' parents (e.g. /root for a pyenv Python) must be traversable for the service user
    parents = sorted({str(d) for b in binds for d in b.parents if str(d) != "/"})
    c.run("chmod", "o+x", *parents)
    r = c.run(str(venv / "bin/python"), "-c", "import sqlite3, ssl, ctypes, torch, aiohttp", check=False)
    if r.returncode:
        raise Unavailable(f"the venv does not run in the container (a library missing from "
                          f"nspawn_util.PACKAGES?): {r.stderr.strip().splitlines()[-1:]}")
    c.run(str(ROOT / "systemd/setup.sh"), "install", str(venv), timeout=120)  # what install.sh runs
    # a checkout under /tmp (CI may use one) is hidden from the service by PrivateTmp=yes: bind it into the
    # service's private namespace (a real install lives outside /tmp; setup.sh warns about a venv there)
    hidden = [str(b) for b in binds if str(b).startswith(("/tmp/", "/var/tmp/"))]
    if hidden:
        for unit in ("tts-appliance.service", "tts-appliance@.service"):
            c.run("mkdir", "-p", f"/etc/systemd/system/{unit}.d")
            c.run("tee", f"/etc/systemd/system/{unit}.d/checkout-in-tmp.conf",
                  input="[Service]\nBindReadOnlyPaths=" + " ".join(hidden) + "\n")
        c.run("systemctl", "daemon-reload")
    c.run("mkdir", "-p", "/etc/tts-appliance/config.d")
    c.run("tee", "/etc/tts-appliance/config.d/test.yaml", input=TEST_CONFIG)
    c.run("systemctl", "enable", "--now", "tts-appliance.socket")


def show(c: Container, unit: str, *props: str) -> dict:
    out = c.run("systemctl", "show", "-p", ",".join(props), unit).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_for(pred, timeout: float, what: str, c: Container, unit: str = SERVICE):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout:.0f} s\n{journal(c, unit)[-3000:]}")


def journal(c: Container, unit: str = SERVICE) -> str:
    return c.run("journalctl", "--no-pager", "-o", "cat", "-u", unit, check=False).stdout


def group_member(c: Container) -> tuple[int, list[int]]:
    gid = int(c.run("getent", "group", "tts-appliance").stdout.split(":")[2])
    return 4243, [4243, gid]


def get(c: Container, url: str, user, sock: str = API, timeout: float = 60) -> dict:
    r = c.run(str(nspawn_util.interpreter()[0] / "bin/python"), "-I", "-c", CLIENT, sock, url, str(timeout),
              user=user, timeout=timeout + 10)
    return json.loads(r.stdout)


def ensure_active(c: Container, unit: str = SERVICE) -> None:
    if show(c, unit, "ActiveState")["ActiveState"] != "active":
        c.run("systemctl", "start", unit, timeout=180)


def test_start_returns_after_ready_with_status(box):
    box.run("systemctl", "stop", SERVICE, timeout=120)
    t0 = time.monotonic()
    box.run("systemctl", "start", SERVICE, timeout=180)  # Type=notify: returns once READY=1 arrived
    took = time.monotonic() - t0
    s = show(box, SERVICE, "ActiveState", "SubState", "StatusText", "MainPID")
    assert (s["ActiveState"], s["SubState"]) == ("active", "running"), s
    assert s["StatusText"].startswith("ok;") and "slots" in s["StatusText"], s
    assert "ready: http unix:/run/tts-appliance/api.sock" in journal(box)
    assert get(box, "/health", group_member(box))["status"] == 200  # no wait: it already serves
    print(f"systemctl start took {took:.1f} s")


def test_config_is_readable_by_the_service_only(box):
    """It may hold jobs.queue's database password; the service (its group) still reads it: it started."""
    ensure_active(box)
    conf = "/etc/tts-appliance/config.yaml"
    assert box.run("stat", "-c", "%a %U %G", conf).stdout.split() == ["640", "root", "tts-appliance"]


def test_socket_is_group_only(box):
    ensure_active(box)
    assert box.run("stat", "-c", "%a %G", API).stdout.split() == ["660", "tts-appliance"]
    refused = get(box, "/health", OUTSIDER)
    assert refused.get("errno") == 13, refused  # EACCES
    assert get(box, "/health", group_member(box))["status"] == 200


def test_reload_keeps_the_daemon(box):
    ensure_active(box)
    pid = show(box, SERVICE, "MainPID")["MainPID"]
    before = journal(box).count("configuration reloaded")
    box.run("systemctl", "reload", SERVICE)
    wait_for(lambda: journal(box).count("configuration reloaded") > before, 300, "reload logged", box)
    s = show(box, SERVICE, "ActiveState", "MainPID")
    assert s == {"ActiveState": "active", "MainPID": pid}, s


def test_reload_of_an_invalid_config_fails_and_keeps_the_daemon(box):
    ensure_active(box)
    pid = show(box, SERVICE, "MainPID")["MainPID"]
    box.run("tee", "/etc/tts-appliance/config.d/zz-broken.yaml", input="model: {threads: many}\n")
    try:
        r = box.run("systemctl", "reload", SERVICE, check=False)
        assert r.returncode != 0, "systemctl reload reported success for an invalid config"
        s = show(box, SERVICE, "ActiveState", "MainPID")
        assert s == {"ActiveState": "active", "MainPID": pid}, s
    finally:
        box.run("rm", "-f", "/etc/tts-appliance/config.d/zz-broken.yaml")
    box.run("systemctl", "reload", SERVICE)  # valid again: reloads


def test_inbox_file_of_a_group_member_becomes_group_readable_audio(box):
    """The sandbox (PrivateUsers, UMask=0027, read-only OS) still lets the jobs worker do its work."""
    ensure_active(box)
    member = group_member(box)
    inbox = "/var/lib/tts-appliance/inbox"
    box.run("tee", f"{inbox}/hello.yaml", user=member, input="voice: ryan\nformat: wav\nsampling: {max_new_tokens: 4}\n")
    box.run("tee", f"{inbox}/hello.txt", user=member, input="Hello from the inbox.\n")

    def finished():
        jobs = json.loads(get(box, "/v1/jobs", member)["body"])
        return jobs[0] if jobs and jobs[0]["state"] in ("done", "partial", "failed") else None

    job = wait_for(finished, 300, "inbox job finished", box)
    assert job["state"] == "done", f"{job}\n{journal(box)[-3000:]}"
    files = box.run("find", job["output_dir"], "-type", "f", "-printf", "%m %g %p\n", user=member).stdout.split("\n")
    audio = [f.split(" ", 2) for f in files if f.endswith(".wav")]
    assert audio and all(mode == "640" and group == "tts-appliance" for mode, group, _ in audio), files
    assert box.run("head", "-c", "4", audio[0][2], user=member).stdout == "RIFF"


def test_watchdog_restarts_a_hung_daemon(box):
    dropin = "/etc/systemd/system/tts-appliance.service.d/watchdog-test.conf"
    box.run("mkdir", "-p", dropin.rsplit("/", 1)[0])
    box.run("tee", dropin, input="[Service]\nWatchdogSec=2\nRestartSec=1\nLimitCORE=0\n")
    try:
        box.run("systemctl", "daemon-reload")
        box.run("systemctl", "restart", SERVICE, timeout=180)
        s = show(box, SERVICE, "MainPID", "NRestarts")
        box.run("systemctl", "kill", "--kill-who=main", "--signal=SIGSTOP", SERVICE)  # hung: no WATCHDOG=1
        t0 = time.monotonic()

        def restarted():
            now = show(box, SERVICE, "ActiveState", "MainPID", "NRestarts")
            return (now["ActiveState"] == "active" and now["MainPID"] not in ("0", s["MainPID"])
                    and int(now["NRestarts"]) == int(s["NRestarts"]) + 1)

        wait_for(restarted, 300, "restart by the watchdog", box)
        print(f"watchdog restart took {time.monotonic() - t0:.1f} s")
        assert "Watchdog timeout" in journal(box)
    finally:
        box.run("rm", "-f", dropin)
        box.run("systemctl", "daemon-reload")


def test_socket_activation_starts_the_service(box):
    box.run("systemctl", "stop", SERVICE, timeout=120)
    assert show(box, SERVICE, "ActiveState")["ActiveState"] in ("inactive", "failed")
    assert show(box, "tts-appliance.socket", "SubState")["SubState"] == "listening"
    t0 = time.monotonic()
    assert get(box, "/health", group_member(box), timeout=120)["status"] == 200  # waits in the backlog
    print(f"activation to first answer took {time.monotonic() - t0:.1f} s")
    assert show(box, SERVICE, "ActiveState")["ActiveState"] == "active"


def test_stop_is_quick_and_clean(box):
    ensure_active(box)
    t0 = time.monotonic()
    box.run("systemctl", "stop", SERVICE, timeout=180)
    took = time.monotonic() - t0
    s = show(box, SERVICE, "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    assert s == {"ActiveState": "inactive", "Result": "success", "ExecMainCode": "1", "ExecMainStatus": "0"}, s
    print(f"systemctl stop took {took:.1f} s")  # (a stop past TimeoutStopSec would be Result=timeout, SIGKILL)
    assert "stopping: no new work; in-flight segments get 80 s" in journal(box)  # service.stop_timeout_s 85, less 5


def test_instance_unit_serves_its_own_group_only_sockets(box):
    """The daemon makes these sockets itself; http.group names the group it already has (no chown)."""
    sock, dropin = "/run/tts-appliance/0/api.sock", "/etc/systemd/system/tts-appliance@0.service.d/group.conf"
    box.run("mkdir", "-p", dropin.rsplit("/", 1)[0])
    box.run("tee", dropin, input="[Service]\nEnvironment=TTS_APPLIANCE_HTTP__GROUP=tts-appliance\n")
    box.run("systemctl", "daemon-reload")
    box.run("systemctl", "start", INSTANCE, timeout=180)
    try:
        assert show(box, INSTANCE, "ActiveState")["ActiveState"] == "active"
        assert box.run("stat", "-c", "%a %G", sock).stdout.split() == ["660", "tts-appliance"]
        assert get(box, "/health", OUTSIDER, sock=sock).get("errno") == 13
        assert get(box, "/health", group_member(box), sock=sock)["status"] == 200
    finally:
        box.run("systemctl", "stop", INSTANCE, timeout=180)
        box.run("rm", "-f", dropin)
        box.run("systemctl", "daemon-reload")
    assert show(box, INSTANCE, "Result")["Result"] == "success"


def test_security_exposure_is_low(box):
    out = box.run("systemd-analyze", "security", "--no-pager", SERVICE, INSTANCE, check=False).stdout
    scores = {m[1]: float(m[2]) for m in re.finditer(r"Overall exposure level for (\S+): ([\d.]+)", out)}
    assert set(scores) == {SERVICE, INSTANCE}, out[-2000:]
    assert max(scores.values()) <= 3.5, scores
    print(f"exposure: {scores}")



# -- an admin's day: the people who use the service, and the service stopping mid-book ----------------------
MEMBER, OUTSIDER_NAME = "member", "outsider"
# one segment a paragraph; more than the service leases at once (its slots: up to 64 on a CPU), so a stop
# comes while some are in flight and others wait
BOOK = "\n\n".join(f"Paragraph {i} of the long book is read aloud by the service." for i in range(200)) + "\n"


def person(c: Container, name: str, member: bool) -> tuple[int, list[int]]:
    """A real login user in the container (home folder, passwd entry), in group tts-appliance or not."""
    if c.run("id", "-u", name, check=False).returncode:
        c.run("useradd", "-m", "-s", "/bin/sh", *(["-G", "tts-appliance"] if member else []), name)
    uid = int(c.run("id", "-u", name).stdout)
    gids = [int(g) for g in c.run("id", "-G", name).stdout.split()]
    return uid, gids


def cli(c: Container, name: str, member: bool, *args: str, timeout: float = 300) -> "subprocess.CompletedProcess":
    """`tts-appliance ARGS` as the user `name` would type it in a login shell (the installed command)."""
    return c.run("env", f"HOME=/home/{name}", f"USER={name}", "/usr/local/bin/tts-appliance", *args,
                 user=person(c, name, member), check=False, timeout=timeout)


def queue_rows(c: Container, job_id: str) -> dict:
    """{segment index: (state, audio path)} of a job, read from the service's queue as root."""
    code = ("import json, sys\nfrom jobs.queue import Queue\nq = Queue(sys.argv[1])\n"
            "print(json.dumps({s['idx']: [s['state'], s['audio_path']] for s in q.segments(sys.argv[2])}))")
    r = c.run(str(nspawn_util.interpreter()[0] / "bin/python"), "-c", code, "/var/lib/tts-appliance/queue.db", job_id)
    return {int(k): tuple(v) for k, v in json.loads(r.stdout).items()}


def test_a_cli_call_wakes_the_stopped_service_and_waits_for_it(box):
    # A start that takes longer than the CLI's first answer window (appliance.client.ANSWER_S), whatever the machine's
    # speed: a drop-in holds the start back first (a real model's load takes that long; the tiny one may not).
    dropin = f"/etc/systemd/system/{SERVICE}.d/slow-start.conf"
    box.run("systemctl", "stop", SERVICE, timeout=120)
    box.run("mkdir", "-p", f"/etc/systemd/system/{SERVICE}.d")
    box.run("tee", dropin, input=f"[Service]\nExecStartPre=/bin/sleep {ANSWER_S + 3:.0f}\n")
    box.run("systemctl", "daemon-reload")
    try:
        assert show(box, "tts-appliance.socket", "SubState")["SubState"] == "listening"
        r = cli(box, MEMBER, True, "list", "--json")
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{journal(box)[-2000:]}"
        assert json.loads(r.stdout) is not None and "timed out" not in r.stderr
        assert "it is starting" in r.stderr, r.stderr  # the wait is said, not silent
        assert show(box, SERVICE, "ActiveState")["ActiveState"] == "active"
    finally:
        box.run("rm", "-f", dropin)
        box.run("systemctl", "daemon-reload")


def test_someone_outside_the_group_is_told_to_join_it(box):
    ensure_active(box)
    r = cli(box, OUTSIDER_NAME, False, "list")
    assert r.returncode != 0 and "usermod -aG tts-appliance" in r.stderr, r.stdout + r.stderr


def test_stop_mid_book_lets_in_flight_segments_finish_and_none_is_redone(box):
    ensure_active(box)
    box.run("tee", "/home/member/book.txt", input=BOOK, user=person(box, MEMBER, True))
    r = cli(box, MEMBER, True, "submit", "/home/member/book.txt", "--voice", "ryan", "--format", "wav",
            "--max-new-tokens", "60", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = json.loads(r.stdout)[0]["job_id"]
    leased = wait_for(lambda: [i for i, (s, _) in queue_rows(box, job_id).items() if s == "leased"], 300,
                      "segments in flight", box)
    since = box.run("date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    box.run("systemctl", "stop", SERVICE, timeout=120)
    stopped = queue_rows(box, job_id)
    log = box.run("journalctl", "--no-pager", "-o", "cat", "-u", SERVICE, "--since", since).stdout
    assert "in flight failed" not in log and "killed by" not in log, log[-3000:]
    assert all(stopped[i][0] == "done" for i in leased), (leased, stopped, log[-3000:])
    assert not [i for i, (s, _) in stopped.items() if s == "leased"], stopped
    assert any(s != "done" for s, _ in stopped.values()), "the book ended before the stop: make it longer"
    box.run("systemctl", "start", SERVICE, timeout=180)

    def finished():
        rows = queue_rows(box, job_id)
        return rows if all(s == "done" for s, _ in rows.values()) else None

    after = wait_for(finished, 300, "the book finished after the restart", box)
    redone = [i for i, (s, path) in stopped.items() if s == "done" and after[i][1] != path]
    assert not redone, f"segments synthesized again after the restart: {redone}"
    logs = cli(box, MEMBER, True, "logs", job_id)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stdout + logs.stderr


def test_a_member_reads_the_services_queue_and_makes_nothing_of_their_own(box):
    ensure_active(box)
    jobs = json.loads(get(box, "/v1/jobs", group_member(box))["body"])
    assert jobs, "an earlier test left no job"
    job_id = jobs[-1]["id"]
    for args in (["logs", job_id], ["status", job_id], ["list"]):
        r = cli(box, MEMBER, True, *args)
        assert r.returncode == 0 and r.stdout.strip(), (args, r.stdout, r.stderr)
        assert "no job" not in r.stdout + r.stderr
    r = cli(box, MEMBER, True, "info", "--json")
    assert r.returncode == 0, r.stderr
    paths = json.loads(r.stdout)["paths"]
    assert paths["home"] == "/var/lib/tts-appliance" and "error" not in paths["jobs"], paths
    # the service's own runtime folder and sockets (RuntimeDirectory=), not ones it never uses
    assert (paths["runtime_dir"], paths["http_socket"], paths["wyoming_socket"]) == (
        "/run/tts-appliance", API, "/run/tts-appliance/wyoming.sock"), paths
    assert sum(paths["jobs"].values()) >= len(jobs), paths
    box.run("tee", "/home/member/short.txt", input="A short text to preview.\n", user=person(box, MEMBER, True))
    r = cli(box, MEMBER, True, "preview", "/home/member/short.txt")
    assert r.returncode == 0 and "segments" in r.stdout, r.stdout + r.stderr
    own = box.run("find", "/home/member", "-name", "tts-appliance*", check=False).stdout.strip()
    assert not own, f"a reading command made a private spool: {own}"


def test_errors_are_at_priority_err_in_the_journal(box):
    ensure_active(box)
    box.run("tee", "/etc/tts-appliance/config.d/zz-broken.yaml", input="model: {threads: many}\n")
    try:
        assert box.run("systemctl", "reload", SERVICE, check=False).returncode != 0
    finally:
        box.run("rm", "-f", "/etc/tts-appliance/config.d/zz-broken.yaml")
    err = box.run("journalctl", "--no-pager", "-o", "cat", "-p", "err", "-u", SERVICE, check=False).stdout
    assert "config error" in err and "threads" in err, err[-2000:]
    info = box.run("journalctl", "--no-pager", "-o", "cat", "-p", "info", "-u", SERVICE).stdout
    assert "ready: http" in info and "ready: http" not in err  # the rest keeps its own priority


def test_a_bad_config_fails_once_at_priority_err_and_is_not_retried(box):
    ensure_active(box)
    before = int(show(box, SERVICE, "NRestarts")["NRestarts"])
    box.run("tee", "/etc/tts-appliance/config.d/zz-broken.yaml", input="jobs: {nope: 1}\n")
    try:
        assert box.run("systemctl", "restart", SERVICE, check=False, timeout=180).returncode != 0
        time.sleep(8)  # RestartSec=5: a restart would have come by now
        s = show(box, SERVICE, "ActiveState", "NRestarts", "ExecMainStatus")
        assert (s["ActiveState"], s["ExecMainStatus"], int(s["NRestarts"])) == ("failed", "78", before), s
        err = box.run("journalctl", "--no-pager", "-o", "cat", "-p", "err", "-u", SERVICE, check=False).stdout
        assert "config error" in err and "nope" in err, err[-2000:]
    finally:
        box.run("rm", "-f", "/etc/tts-appliance/config.d/zz-broken.yaml")
    box.run("systemctl", "start", SERVICE, timeout=180)


def test_an_inbox_file_the_service_cannot_read_is_one_error_a_failed_job_and_kept(box):
    """root's file, mode 0600, in the inbox: the service (its own user, PrivateUsers) cannot open it. One error
    line (not a traceback at every poll), a failed job naming the fix, the file kept, /health listing it."""
    ensure_active(box)
    inbox = "/var/lib/tts-appliance/inbox/secret.txt"
    since = box.run("date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    box.run("tee", inbox, input="Nobody else may read this.\n")
    box.run("chmod", "0600", inbox)
    member = group_member(box)

    def failed_job():
        jobs = json.loads(get(box, "/v1/jobs", member)["body"])
        return next((j for j in jobs if "secret.txt" in json.dumps(j) and j["state"] == "failed"), None)

    job = wait_for(failed_job, 300, "a failed job for the unreadable file", box)  # (a failure guard)
    assert "cannot read secret.txt" in json.dumps(job), job
    time.sleep(6)  # several polls of the inbox (watch_quiet_s 0.5): still one line
    log = box.run("journalctl", "--no-pager", "-o", "cat", "-u", SERVICE, "--since", since).stdout
    lines = [x for x in log.splitlines() if "secret.txt" in x]
    assert len(lines) == 1 and "Traceback" not in log, lines or log[-3000:]
    err = box.run("journalctl", "--no-pager", "-o", "cat", "-p", "err", "-u", SERVICE, "--since", since).stdout
    assert "cannot read secret.txt" in err, err
    assert box.run("test", "-f", inbox, check=False).returncode == 0, "the file must stay where it was"
    health = json.loads(get(box, "/health", member)["body"])
    assert "secret.txt" in json.dumps(health.get("parts", {})), health
    box.run("rm", "-f", inbox)


# -- the admin's day, continued: upgrades, starts that cannot succeed, failed jobs ---------------------------
def setup_sh(c: Container, *env: str, timeout: float = 300) -> "subprocess.CompletedProcess":
    """systemd/setup.sh install VENV as install.sh runs it over an existing install (an upgrade)."""
    return c.run("env", *env, str(ROOT / "systemd/setup.sh"), "install", str(nspawn_util.interpreter()[0]),
                 timeout=timeout)


def test_an_upgrade_restarts_the_running_service_and_reowns_nothing_it_did_not_make(box):
    ensure_active(box)
    before = show(box, SERVICE, "MainPID")["MainPID"]
    private = "/var/lib/tts-appliance/inbox/root-only.txt"  # a file the installer did not make: root's, 0600
    box.run("tee", private, input="Nobody else may read this.\n")
    box.run("chmod", "0600", private)
    try:
        r = setup_sh(box)
        # still root's and still there (re-owned, the service would have read it and made a job of it)
        owner = box.run("stat", "-c", "%U %a", private, check=False)
        assert owner.stdout.split() == ["root", "600"], owner.stdout + owner.stderr
        assert f"upgrade: restarting {SERVICE}" in r.stdout and f"upgrade: {SERVICE} restarted" in r.stdout, r.stdout
        assert "enable --now" not in r.stdout, r.stdout  # not the first install's line
        now = show(box, SERVICE, "ActiveState", "MainPID")
        assert now["ActiveState"] == "active" and now["MainPID"] not in ("0", before), now
        # the models folder it made is the service's (tmpfiles.d), the config the service's group's
        assert box.run("stat", "-c", "%U", "/var/lib/tts-appliance/models").stdout.strip() == "tts-appliance"

        r = setup_sh(box, "SETUP_RESTART=0")  # install.sh --no-restart: told plainly, left running
        assert "still runs the version it started with" in r.stdout and f"systemctl restart {SERVICE}" in r.stdout, \
            r.stdout
        assert show(box, SERVICE, "MainPID")["MainPID"] == now["MainPID"]
    finally:
        box.run("rm", "-f", private)


@pytest.mark.parametrize("case", ["device", "checkpoint"])
def test_a_start_that_cannot_succeed_exits_78_once_with_what_to_fix(box, case):
    """A device that is not there, a checkpoint that does not load: exit status 78 (RestartPreventExitStatus), the
    unit failed at once instead of restarting every few seconds for ever, one line at priority err."""
    ensure_active(box)
    broken = "/var/lib/tts-appliance/broken-checkpoint"
    if case == "checkpoint":
        box.run("cp", "-rL", str(ROOT / "tests/data/tiny/cv_small"), broken)  # (its codec folder is a link)
        box.run("tee", f"{broken}/model.safetensors", input="not a safetensors file")
        dropin, says = f"model: {{path: {broken}}}\n", "model.safetensors"
    else:
        dropin, says = "model: {device: cuda}\n", "no CUDA GPU is visible here"
    before = int(show(box, SERVICE, "NRestarts")["NRestarts"])
    since = box.run("date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    box.run("tee", "/etc/tts-appliance/config.d/zz-start.yaml", input=dropin)
    try:
        assert box.run("systemctl", "restart", SERVICE, check=False, timeout=300).returncode != 0
        # the start job has ended: a unit that would be restarted is in auto-restart now, not failed
        s = show(box, SERVICE, "ActiveState", "SubState", "ExecMainStatus", "NRestarts")
        assert (s["ActiveState"], s["ExecMainStatus"], int(s["NRestarts"])) == ("failed", "78", before), s
        err = box.run("journalctl", "--no-pager", "-o", "cat", "-p", "err", "-u", SERVICE, "--since", since).stdout
        ours = [x for x in err.splitlines() if says in x]
        assert len(ours) == 1 and ("fix it" in ours[0] or "set model.device" in ours[0]), err
    finally:
        box.run("rm", "-rf", "/etc/tts-appliance/config.d/zz-start.yaml", broken)
    box.run("systemctl", "start", SERVICE, timeout=180)


def test_a_failed_job_is_at_priority_err(box):
    """A job whose book cannot be written (its output folder is not writable, as on a disk an admin mounted
    read-only) ends failed, and `journalctl -p err` shows it."""
    ensure_active(box)
    output = "/var/lib/tts-appliance/output"
    mode = box.run("stat", "-c", "%a", output).stdout.strip()
    box.run("tee", "/home/member/fails.txt", input="This book cannot be written.\n", user=person(box, MEMBER, True))
    since = box.run("date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    box.run("chmod", "0550", output)
    try:
        r = cli(box, MEMBER, True, "submit", "/home/member/fails.txt", "--voice", "ryan", "--format", "wav",
                "--max-new-tokens", "8", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        job_id = json.loads(r.stdout)[0]["job_id"]
        member = group_member(box)

        def ended():
            job = json.loads(get(box, f"/v1/jobs/{job_id}", member)["body"])
            return job if job["state"] in ("done", "partial", "failed") else None

        job = wait_for(ended, 300, "the job ended", box)
        assert job["state"] == "failed", job
    finally:
        box.run("chmod", mode, output)
    err = box.run("journalctl", "--no-pager", "-o", "cat", "-p", "err", "-u", SERVICE, "--since", since).stdout
    assert f"job {job_id} failed" in err, err[-3000:]
