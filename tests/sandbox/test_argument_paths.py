"""What a path named in a server's arguments adds to its sandbox (bastion/argument_paths.py): the rule, the review
that describes it and the bwrap mounts that carry it out agreeing, and real sandboxed processes writing, or not,
where the rule says."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bastion.argument_paths import absolute_argument, argument_binds, granting
from bastion.clients.grants import review
from bastion.sandbox import SandboxConfig
from bastion.sandbox.engine import find_engine
from bastion.sandbox.process import plan_sandbox

REPO = Path(__file__).parents[2]
HOME = "/home/ana"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "shop.db").write_text("")
    return folder


def binds(args: list[str], base: str = "/", **grants: list[str]) -> tuple[str, ...]:
    return argument_binds(args, base=base, home=HOME, **grants).read_only


# ------------------------------------------------------------------------------------------------ the rule
def test_a_file_inside_a_writable_grant_is_left_to_the_grant(data: Path) -> None:
    grant = {"writable": [str(data)]}
    assert binds(["--db-path", str(data / "shop.db")], **grant) == ()
    assert binds([f"--db-path={data / 'shop.db'}"], **grant) == ()
    assert binds([str(data / "new.db")], **grant) == (), "a file the server creates needs nothing of its own"
    assert binds([str(data)], **grant) == (), "the grant itself"
    assert binds(["./shop.db"], base=str(data), **grant) == ()


def test_a_path_in_no_grant_is_bound_read_only_when_it_exists(data: Path) -> None:
    assert binds(["--db-path", str(data / "shop.db")]) == (str(data / "shop.db"),)
    assert binds([f"--db-path={data / 'shop.db'}"]) == (str(data / "shop.db"),)
    assert binds([str(data / "missing.db")]) == ()


def test_a_grant_is_a_folder_not_a_prefix_of_names(tmp_path: Path, data: Path) -> None:
    beside = tmp_path / "data2"
    beside.mkdir()
    assert binds([str(beside)], writable=[str(data)]) == (str(beside),)


def test_dot_dot_leaves_the_grant_by_name(tmp_path: Path, data: Path) -> None:
    (tmp_path / "outside.txt").write_text("")
    assert binds([f"{data}/../outside.txt"], writable=[str(data)]) == (str(tmp_path / "outside.txt"),)
    assert binds([f"{data}/sub/../shop.db"], writable=[str(data)]) == ()


def test_nested_grants_the_innermost_decides(data: Path) -> None:
    (data / "ref").mkdir()
    (data / "ref" / "table.csv").write_text("")
    assert granting(str(data / "ref" / "table.csv"), [str(data), str(data / "ref")]) == str(data / "ref")
    assert granting(str(data / "shop.db"), [str(data), str(data / "ref")]) == str(data)
    assert binds([str(data / "ref" / "table.csv")], writable=[str(data)], read_only=[str(data / "ref")]) == ()
    assert binds([str(data / "ref" / "table.csv")], read_only=[str(data)], writable=[str(data / "ref")]) == ()


def test_a_symlink_inside_a_grant_is_never_bound_on_its_own(tmp_path: Path, data: Path) -> None:
    # A server that may write its folder may have made the link itself: bound, its target would be shown.
    secret = tmp_path / "secret"
    secret.write_text("")
    (data / "shop.db").unlink()
    (data / "shop.db").symlink_to(secret)
    assert binds([str(data / "shop.db")], writable=[str(data)]) == ()


def test_the_home_its_parents_and_kernel_trees_are_never_bound() -> None:
    found = argument_binds(["/", "~", HOME, "/home", "/proc/self", "/dev/null", "--root=/sys"], base="/", home=HOME)
    assert found.read_only == ()
    assert set(found.refused) <= {"/", HOME, "/home"} and "/" in found.refused


# ----------------------------------------------------------------------------- the review says what is bound
CASES = {
    "database in its writable folder": lambda d: ([f"--db-path={d}/shop.db"], [str(d)], []),
    "database in no grant": lambda d: (["--db-path", f"{d}/shop.db"], [], []),
    "the folder itself": lambda d: ([str(d)], [str(d)], []),
    "read-only inside writable": lambda d: ([f"{d}/ref/table.csv"], [str(d)], [f"{d}/ref"]),
    "writable inside read-only": lambda d: ([f"{d}/ref/table.csv"], [f"{d}/ref"], [str(d)]),
    "dot dot out of the grant": lambda d: ([f"{d}/ref/../../outside.txt", f"{d}/shop.db"], [f"{d}/ref"], []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_review_names_exactly_the_mounts_the_sandbox_makes(tmp_path: Path, data: Path, case: str) -> None:
    (data / "ref").mkdir()
    (data / "ref" / "table.csv").write_text("")
    (tmp_path / "outside.txt").write_text("")
    (tmp_path / "work").mkdir()
    args, writable, read_only = CASES[case](data)
    described = review("s", {"command": "/bin/cat", "args": args,
                             "sandbox": {"writable": writable, "read_only": read_only}})
    plan = plan_sandbox(find_engine(), "/bin/cat", args, {}, None,
                        SandboxConfig(writable=tuple(writable), read_only=tuple(read_only)), str(tmp_path / "work"),
                        None)
    shown = {mount.dest: mount.kind for mount in plan.mounts if mount.dest.startswith(str(tmp_path))}
    assert sorted(described.writes) == sorted(path for path, kind in shown.items() if kind == "rw")
    assert sorted(described.reads) == sorted(shown) == sorted({*writable, *read_only, *described.reads})


def test_an_argument_naming_the_home_is_shown_by_neither(tmp_path: Path) -> None:
    # The review said so (an empty private home there) while the sandbox bound the whole home read-only.
    home = os.path.expanduser("~")
    (tmp_path / "work").mkdir()
    described = review("s", {"command": "/bin/cat", "args": [home, f"--root={home}"]})
    plan = plan_sandbox(find_engine(), "/bin/cat", [home, f"--root={home}"], {}, None, SandboxConfig(),
                        str(tmp_path / "work"), None)
    assert "~" not in described.reads and home not in described.reads
    assert [mount.kind for mount in plan.mounts if mount.dest == home] == ["tmpfs"]


# ------------------------------------------------------------------------------------ real sandboxed writes
def sandboxed(grants: list[str], script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``bastion sandbox run`` of a small Python program given ``args``, as a server is given its own."""
    return subprocess.run([sys.executable, "-m", "bastion", "sandbox", "run", "--quiet", *grants, "--",
                           "/usr/bin/python3", "-c", script, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, stdin=subprocess.DEVNULL)


SQLITE_WRITE = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1])
connection.execute("PRAGMA journal_mode=" + sys.argv[2])
connection.execute("CREATE TABLE IF NOT EXISTS items (name TEXT)")
connection.execute("INSERT INTO items VALUES ('widget')")
connection.commit()
print(connection.execute("SELECT count(*) FROM items").fetchone()[0])
"""


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_a_database_named_in_the_arguments_is_written_in_its_writable_folder(data: Path, journal: str) -> None:
    existing = data / "existing.db"
    with sqlite3.connect(existing) as connection:
        connection.execute("CREATE TABLE items (name TEXT)")
    connection.close()
    for database in (existing, data / "created.db"):
        done = sandboxed(["--writable", str(data)], SQLITE_WRITE, str(database), journal)
        assert done.returncode == 0 and done.stdout == "1\n", done.stderr
    with sqlite3.connect(data / "created.db") as connection:
        assert connection.execute("SELECT name FROM items").fetchall() == [("widget",)]
    connection.close()


APPEND = """
import sys
try:
    with open(sys.argv[1], "a") as handle:
        handle.write("changed\\n")
    print("written")
except OSError as error:
    print(error.strerror)
"""


def test_nested_grants_decide_in_a_real_sandbox(data: Path) -> None:
    (data / "ref").mkdir()
    (data / "ref" / "table.csv").write_text("a,b\n")
    read_only_inside = sandboxed(["--writable", str(data), "--read-only", str(data / "ref")], APPEND,
                                 str(data / "ref" / "table.csv"))
    writable_inside = sandboxed(["--read-only", str(data), "--writable", str(data / "ref")], APPEND,
                                str(data / "ref" / "table.csv"))
    assert read_only_inside.stdout == "Read-only file system\n", read_only_inside.stderr
    assert writable_inside.stdout == "written\n", writable_inside.stderr


def test_a_path_out_of_the_grant_by_dot_dot_stays_read_only(tmp_path: Path, data: Path) -> None:
    (tmp_path / "outside.txt").write_text("before\n")
    done = sandboxed(["--writable", str(data)], APPEND, f"{data}/../outside.txt")
    assert done.stdout == "Read-only file system\n", done.stderr
    assert (tmp_path / "outside.txt").read_text() == "before\n"


READ = """
import sys
try:
    print(open(sys.argv[1]).read(), end="")
except OSError as error:
    print(error.strerror)
"""


def test_a_symlink_a_server_left_in_its_folder_does_not_show_what_it_points_to(tmp_path: Path, data: Path) -> None:
    secret = tmp_path / "id_ed25519"
    secret.write_text("PRIVATE KEY\n")
    (data / "shop.db").unlink()
    (data / "shop.db").symlink_to(secret)
    done = sandboxed(["--writable", str(data)], READ, str(data / "shop.db"))
    assert "PRIVATE KEY" not in done.stdout
    assert done.stdout == "No such file or directory\n", done.stderr
    assert os.path.islink(data / "shop.db")


def test_relative_arguments_are_made_absolute_alone_or_as_an_options_value() -> None:
    assert absolute_argument("./shop.db", "/srv/p") == "/srv/p/shop.db"
    assert absolute_argument("--db-path=./data/../shop.db", "/srv/p") == "--db-path=/srv/p/shop.db"
    assert absolute_argument(".", "/srv/p") == "/srv/p" and absolute_argument("..", "/srv/p") == "/srv"
    assert absolute_argument("--db-path=", "/srv/p") == "--db-path="
    assert absolute_argument("data/shop.db", "/srv/p") == "data/shop.db", "a bare word may not be a path"
    assert absolute_argument("--level=.5", "/srv/p") == "--level=.5"


def test_a_grant_reached_through_a_symlink_keeps_the_database_in_it_writable(tmp_path: Path) -> None:
    real = tmp_path / "disk" / "data"
    real.mkdir(parents=True)
    link = tmp_path / "data"
    link.symlink_to(real)
    with sqlite3.connect(real / "shop.db") as connection:
        connection.execute("CREATE TABLE items (name TEXT)")
    connection.close()
    done = sandboxed(["--writable", str(link)], SQLITE_WRITE, str(link / "shop.db"), "delete")
    assert done.returncode == 0 and done.stdout == "1\n", done.stderr


def test_a_working_folder_inside_a_writable_grant_stays_writable(tmp_path: Path, data: Path) -> None:
    (data / "sub").mkdir()
    done = subprocess.run([sys.executable, "-m", "bastion", "sandbox", "run", "--quiet", "--writable", str(data),
                           "--cwd", str(data / "sub"), "--", "/usr/bin/python3", "-c", APPEND, "./made-here.txt"],
                          capture_output=True, text=True, cwd=REPO, timeout=120, stdin=subprocess.DEVNULL)
    assert done.stdout == "written\n", done.stderr
    assert (data / "sub" / "made-here.txt").read_text() == "changed\n"
    described = review("s", {"command": "/bin/cat", "cwd": str(data / "sub"), "sandbox": {"writable": [str(data)]}})
    assert described.reads == [str(data)] and described.writes == [str(data)]


MANY_WRITES = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], timeout=120)
connection.execute("PRAGMA journal_mode=wal")
for _ in range(100):
    with connection:
        connection.execute("INSERT INTO items VALUES ('widget')")
print("done")
"""


def test_two_sandboxed_servers_write_one_database_in_their_shared_folder_at_once(data: Path) -> None:
    # Two sandboxes see the one folder (each its own bind of it): sqlite's locks and WAL index hold across them.
    database = data / "shared.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE items (name TEXT)")
    connection.close()
    command = [sys.executable, "-m", "bastion", "sandbox", "run", "--quiet", "--writable", str(data), "--",
               "/usr/bin/python3", "-c", MANY_WRITES, str(database)]
    writers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                stdin=subprocess.DEVNULL) for _ in range(2)]
    outputs = [writer.communicate(timeout=300) for writer in writers]
    assert [out for out, _ in outputs] == ["done\n", "done\n"], outputs
    with sqlite3.connect(database) as connection:
        assert connection.execute("SELECT count(*) FROM items").fetchone() == (200,)
    connection.close()
