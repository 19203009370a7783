"""Service mode as deployed: real users, real file permissions, dpcli run by the service account for analysts.

Run by ``make test-service`` (and by CI when it runs as root): it needs root to create three users
(the service account and two analysts) and to start processes as them. Every process is started the
way sudo starts it under its environment reset — as the service account, with ``SUDO_USER`` and
``SUDO_UID`` naming the analyst and nothing else of theirs — or as the analyst themself. The users
are removed at the end. ``DPCLI_SERVICE_PYTHON`` is the dpcli the users run (a venv built by the
make target with an interpreter every user can execute).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.deployment

DPCLI = os.environ.get("DPCLI_SERVICE_DPCLI", "")
NAMES = {"svc": "dpcli-t-svc", "alice": "dpcli-t-alice", "bob": "dpcli-t-bob"}


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root, to create users and start processes as them"
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "needs useradd and userdel"
    if not DPCLI or not os.access(DPCLI, os.X_OK):
        return "needs DPCLI_SERVICE_DPCLI: a dpcli every user can run (make test-service builds one)"
    return None


@dataclass
class Deployment:
    base: Path
    svc_home: Path
    data: Path
    out: Path

    def uid(self, who: str) -> int:
        return pwd.getpwnam(NAMES[who]).pw_uid

    def run(self, who: str, *args: str, via_sudo: bool = True) -> subprocess.CompletedProcess[str]:
        """dpcli ARGS as sudo runs it for ``who`` (as the service account), or as ``who`` themself."""
        account = "svc" if via_sudo else who
        user = pwd.getpwnam(NAMES[account])
        env = {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, "LANG": "C.UTF-8", "USER": user.pw_name,
               "LOGNAME": user.pw_name}
        if via_sudo and who != "svc":
            env.update({"SUDO_USER": NAMES[who], "SUDO_UID": str(self.uid(who)),
                        "SUDO_GID": str(pwd.getpwnam(NAMES[who]).pw_gid), "SUDO_COMMAND": DPCLI})
        return subprocess.run([DPCLI, *args], env=env, cwd=self.base, user=user.pw_uid, group=user.pw_gid,
                              extra_groups=[], capture_output=True, text=True, timeout=300, check=False)


def _useradd(name: str, home: Path) -> None:
    subprocess.run(["userdel", name], capture_output=True, check=False)  # a crashed earlier run
    subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin",
                    "--user-group", name], check=True, capture_output=True)


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    why = _why_not()
    if why:
        pytest.skip(why)
    # (not under /tmp: catalog set refuses locations under a sticky world-writable directory)
    base = Path(tempfile.mkdtemp(prefix="dpcli-deploy-", dir="/var/lib" if os.path.isdir("/var/lib") else None))
    base.chmod(0o755)
    try:
        homes = {who: base / who for who in NAMES}
        for who, name in NAMES.items():
            _useradd(name, homes[who])
        for who in NAMES:
            homes[who].mkdir(mode=0o700)
            shutil.chown(homes[who], NAMES[who], NAMES[who])
        d = Deployment(base, homes["svc"], homes["svc"] / "data", base / "out")
        _install(d)
        yield d
    finally:
        for name in NAMES.values():
            subprocess.run(["userdel", name], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


def _install(d: Deployment) -> None:
    """What the README's operator does: private data, output directories, a catalog, ledgers."""
    d.data.mkdir()
    rows = "".join(f"u{i},/p/{i % 3},{i % 7}\n" for i in range(400))
    (d.data / "visits.csv").write_text("user,page,secret\n" + rows)
    (d.data / "pages.csv").write_text("page\n/p/0\n/p/1\n/p/2\n")
    d.out.mkdir(mode=0o755)
    for who in ("alice", "bob"):
        (d.out / who).mkdir(mode=0o755)
        shutil.chown(d.out / who, NAMES["svc"], NAMES["svc"])
    catalog = (f'operators = []\n[datasets.visits]\nlocation = "{d.data / "visits.csv"}"\nprivacy_unit = "user"\n'
               f'analysts = ["*"]\n[public.pages]\nlocation = "{d.data / "pages.csv"}"\nanalysts = ["*"]\n'
               + "".join(f'[[outputs]]\ndirectory = "{d.out / w}"\nanalysts = ["{NAMES[w]}"]\n' for w in ("alice", "bob")))
    for folder in ("shared", "aout"):  # the operator's, at catalog set; handed to alice later (the attacks)
        (d.base / folder).mkdir(mode=0o755)
        shutil.chown(d.base / folder, NAMES["svc"], NAMES["svc"])
    (d.base / "shared" / "list.csv").write_text("page\n/p/0\n")
    shutil.chown(d.base / "shared" / "list.csv", NAMES["svc"], NAMES["svc"])
    (d.base / "aout" / "alice").mkdir(mode=0o755)
    shutil.chown(d.base / "aout" / "alice", NAMES["svc"], NAMES["svc"])
    catalog += (f'[public.shared]\nlocation = "{d.base / "shared" / "list.csv"}"\nanalysts = ["*"]\n'
                f'[[outputs]]\ndirectory = "{d.base / "aout" / "alice"}"\nanalysts = ["{NAMES["alice"]}"]\n')
    (d.svc_home / "catalog.toml").write_text(catalog)
    for path in (d.data, *d.data.iterdir(), d.svc_home / "catalog.toml"):
        shutil.chown(path, NAMES["svc"], NAMES["svc"])
        path.chmod(0o700 if path.is_dir() else 0o600)
    r = d.run("svc", "catalog", "set", str(d.svc_home / "catalog.toml"), via_sudo=False)
    assert r.returncode == 0, r.stderr
    for who in ("alice", "bob"):
        r = d.run("svc", "budget", "init", NAMES[who], "--mode", "approx", "--epsilon", "5", "--delta", "1e-5",
                  via_sudo=False)
        assert r.returncode == 0, r.stderr


QUERY = ["histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6"]


def test_an_analysts_first_query_works_by_dataset_name(deployment):
    r = deployment.run("alice", *QUERY)
    assert r.returncode == 0, r.stderr
    assert "/p/0" in r.stdout
    r = deployment.run("alice", "budget", "show", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["analyst"] == NAMES["alice"]


def test_an_analyst_cannot_read_the_data_the_key_or_the_state(deployment):
    r = deployment.run("alice", "budget", "init", "default", "--mode", "approx", "--epsilon", "1", "--delta", "1e-6",
                       via_sudo=False)  # her own ledger, in her own home: personal mode
    assert r.returncode == 0, r.stderr
    for path in (deployment.data / "visits.csv", deployment.svc_home / ".local/share/dpcli/secret.key"):
        r = deployment.run("alice", "histogram", str(path), "--input-format", "csv", "--by", "page",
                           "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6",
                           via_sudo=False)  # as herself: the OS says no
        assert r.returncode == 66, r.stderr
        with pytest.raises(PermissionError):
            _open_as(deployment.uid("alice"), path)


def test_through_the_service_account_no_path_is_opened_for_the_analyst(deployment):
    private = str(deployment.data / "visits.csv")
    for args in (
        ["histogram", "visits", "--by", "page", "--epsilon", "1", "--keys", private],
        ["histogram", private, "--by", "page", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6"],
        ["plot", private],
        [*QUERY, "-o", str(deployment.base / "anywhere.csv")],
        ["--state-dir", str(deployment.base), "budget", "show"],
        ["budget", "init", NAMES["alice"] + "2", "--mode", "pure", "--epsilon", "9"],
    ):
        r = deployment.run("alice", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert "u17" not in r.stdout + r.stderr


def test_outputs_are_the_analysts_and_plots_only_their_releases(deployment):
    mine = deployment.out / "alice" / "pages.csv"
    r = deployment.run("alice", *QUERY, "-o", str(mine))
    assert r.returncode == 0, r.stderr
    assert deployment.run("alice", "plot", str(mine)).returncode == 0
    assert deployment.run("bob", "plot", str(mine)).returncode == 2  # not in bob's directories, not his release
    assert deployment.run("bob", "budget", "show", NAMES["alice"]).returncode == 2
    r = deployment.run("bob", *QUERY, "-o", str(deployment.out / "alice" / "x.csv"))
    assert r.returncode == 2, r.stderr


def test_without_its_state_directory_the_service_account_runs_nothing_for_an_analyst(deployment):
    """While the state directory is moved away (a restore), dpcli through sudo ran in personal mode as
    the service account: the analyst's own --state-dir and ledger, any path read with its rights."""
    state = deployment.svc_home / ".local/share/dpcli"
    away = state.with_name("dpcli.moved")
    state.rename(away)
    try:
        mine = deployment.svc_home / "alices-state"  # somewhere the service account may write
        for args in (["--state-dir", str(mine), "budget", "init", "default", "--mode", "pure", "--epsilon", "99"],
                     ["--state-dir", str(mine), "histogram", str(deployment.data / "visits.csv"), "--by", "page",
                      "--privacy-unit", "page", "--keys", str(deployment.data / "visits.csv"), "--epsilon", "1"]):
            r = deployment.run("alice", *args)
            assert r.returncode == 2 and "ask the operator" in r.stderr, (args, r.stderr)
            assert "u17" not in r.stdout + r.stderr
        assert not mine.exists() and not state.exists()
    finally:
        shutil.rmtree(deployment.svc_home / "alices-state", ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
        away.rename(state)
    assert deployment.run("alice", *QUERY).returncode == 0


def test_a_forged_sudo_user_is_not_believed_outside_the_service_account(deployment):
    """SUDO_USER set by a user for themself reaches only her own state directory (personal mode, or a
    "service mode" over her own files with no catalog): never the service account's ledgers."""
    user = pwd.getpwnam(NAMES["alice"])
    env = {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, "SUDO_USER": NAMES["bob"], "SUDO_UID": str(deployment.uid("bob"))}
    r = subprocess.run([DPCLI, "budget", "show"], env=env, cwd=deployment.base, user=user.pw_uid, group=user.pw_gid,
                       extra_groups=[], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode in (2, 77), r.stderr
    assert '"epsilon"' not in r.stdout and str(deployment.svc_home) not in r.stderr


def _open_as(uid: int, path: Path) -> None:
    """Open ``path`` in a child running as ``uid``; PermissionError if the OS refuses."""
    pid = os.fork()
    if pid == 0:  # the child: drop to uid, try, report by exit status
        try:
            os.setgroups([])
            os.setgid(pwd.getpwuid(uid).pw_gid)
            os.setuid(uid)
            open(path, "rb").close()
            os._exit(0)
        except PermissionError:
            os._exit(13)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 13:
        raise PermissionError(path)
    assert code == 0, code


def _as(d: Deployment, who: str, script: str) -> None:
    """A shell ``script`` run as ``who`` themself (what the analyst can do with her own rights)."""
    user = pwd.getpwnam(NAMES[who])
    subprocess.run(["sh", "-c", script], user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd=d.base,
                   check=True, capture_output=True, timeout=60)


def test_a_public_list_swapped_for_a_symlink_to_the_data_is_refused(deployment):
    d = deployment
    q = ["histogram", "-", "--by", "page", "--privacy-unit", "user", "--epsilon", "1", "--delta", "1e-6",
         "--keys", "shared"]
    shutil.chown(d.base / "shared", NAMES["alice"], NAMES["alice"])  # the folder handed to alice after catalog set
    _as(d, "alice", f'rm shared/list.csv && ln -s "{d.data / "visits.csv"}" shared/list.csv')
    r = subprocess.run([DPCLI, *q], input="user,page\nu1,/p/0\n", capture_output=True, text=True, check=False,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(d.svc_home), "LANG": "C.UTF-8",
                            "SUDO_USER": NAMES["alice"], "SUDO_UID": str(d.uid("alice"))},
                       user=d.uid("svc"), group=pwd.getpwnam(NAMES["svc"]).pw_gid, extra_groups=[], cwd=d.base)
    assert r.returncode == 2, r.stderr
    assert "/p/1" not in r.stdout and "u1" not in r.stdout


def test_an_output_directory_renamed_and_replaced_by_a_symlink_into_the_data_is_refused(deployment):
    d = deployment
    before = (d.data / "visits.csv").read_bytes()
    shutil.chown(d.base / "aout", NAMES["alice"], NAMES["alice"])  # its parent handed to alice after catalog set
    _as(d, "alice", f'mv aout/alice aout/old && ln -s "{d.data}" aout/alice')
    r = d.run("alice", *QUERY, "-o", str(d.base / "aout" / "alice" / "visits.csv"))
    assert r.returncode == 2, r.stderr
    assert (d.data / "visits.csv").read_bytes() == before


def test_a_link_planted_in_a_partition_handed_to_an_analyst_is_refused(deployment):
    """h-attack, rule 8: a partition directory below a catalog dataset, handed after `catalog set` to someone
    who loads data (here alice herself), gets a link to the file of a dataset only bob may use: the walk from
    the dataset's descriptor refuses it (the partition is alice's, and the link is a link), and no withheld
    row is released through the dataset alice may use."""
    import polars as pl

    d = deployment
    withheld, events = d.data / "withheld", d.base / "events"
    withheld.mkdir(mode=0o700)
    pl.DataFrame({"user": [f"w{i}" for i in range(400)], "page": ["/w/0"] * 400}).write_parquet(
        withheld / "part-0.parquet")
    (events / "year=2026").mkdir(parents=True)
    pl.DataFrame({"user": [f"u{i}" for i in range(100)], "page": ["/p/0"] * 100}).write_parquet(
        events / "year=2026" / "part-0.parquet")
    for path in (withheld, withheld / "part-0.parquet", events, events / "year=2026",
                 events / "year=2026" / "part-0.parquet"):
        shutil.chown(path, NAMES["svc"], NAMES["svc"])
        path.chmod(0o700 if path == withheld else 0o755 if path.is_dir() else 0o644)
    catalog = d.svc_home / "catalog.toml"
    text = (f'operators = []\n[datasets.events]\nlocation = "{events}"\nprivacy_unit = "user"\n'  # (a catalog of its own:
            f'analysts = ["{NAMES["alice"]}"]\n[datasets.withheld]\nlocation = "{withheld}"\n'  # earlier attacks left
            f'privacy_unit = "user"\nanalysts = ["{NAMES["bob"]}"]\n')  # the other one's output folders swapped)
    catalog.write_text(text)
    r = d.run("svc", "catalog", "set", str(catalog), via_sudo=False)
    assert r.returncode == 0, r.stderr
    q = ["histogram", "events", "--by", "page", "--epsilon", "1", "--delta", "1e-6"]
    r = d.run("alice", *q)
    assert r.returncode == 0 and "/p/0" in r.stdout, r.stderr
    shutil.chown(events / "year=2026", NAMES["alice"], NAMES["alice"])  # handed to a loader after catalog set
    _as(d, "alice", f'ln -s "{withheld / "part-0.parquet"}" "{events / "year=2026" / "part-1.parquet"}"')
    r = d.run("alice", *q)
    assert r.returncode == 2 and "/w/0" not in r.stdout and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert str(d.base) not in r.stderr and "year" not in r.stderr
    # the partition given back, the link alone is still refused
    shutil.chown(events / "year=2026", NAMES["svc"], NAMES["svc"])
    r = d.run("alice", *q)
    assert r.returncode == 2 and "/w/0" not in r.stdout, (r.stdout, r.stderr)
