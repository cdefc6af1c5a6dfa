"""Probe programs for the sandbox: honest controls that must score 1, and hostile programs that must score 0.

Shared by `or1 sandbox check` (or1.sandbox.check) and the test suite, so the self-test a user runs is the one CI
runs. Each hostile probe is built so that breaking the isolation is exactly what would earn the reward: its
expected output is something only an escape (a host secret, a network reply, a forged pass) could produce.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Probe:
    """One response to score against one ground truth; `want` is the score it must get."""

    name: str
    program: str
    ground_truth: dict
    want: float
    timeout: float = 2.0
    leaves: tuple[str, ...] = field(default_factory=tuple)  # host paths the probe tries to create

    @property
    def response(self) -> str:
        return f"<think>probe</think>\n```python\n{self.program}\n```\n"


def _stdin(inputs: list[str], outputs: list[str]) -> dict:
    return {"inputs": inputs, "outputs": outputs}


LIST_NODE = "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val = val\n        self.next = next\n"
ASSERT_GT = {
    "import_prefix": "from typing import *\n" + LIST_NODE,
    "test_code": (
        "def check(candidate):\n"
        "    def build(xs):\n"
        "        head = None\n"
        "        for x in reversed(xs):\n"
        "            head = ListNode(x, head)\n"
        "        return head\n"
        "    def values(node):\n"
        "        out = []\n"
        "        while node is not None:\n"
        "            out.append(node.val)\n"
        "            node = node.next\n"
        "        return out\n"
        "    assert values(candidate(build([1, 2, 3]))) == [3, 2, 1]\n"
        "    assert values(candidate(build([]))) == []\n"
        "    assert candidate(build([7])).val == 7\n"
    ),
    "entry_point": "Solution().reverseList",
}
REVERSE_OK = (
    "class Solution:\n"
    "    def reverseList(self, head):\n"
    "        prev = None\n"
    "        while head:\n"
    "            head.next, prev, head = prev, head, head.next\n"
    "        return prev\n"
)
CALL_GT = {"inputs": ["[1, 2, 1, 4, 1]", "[1, 1, 1]"], "outputs": ["1", "0"], "fn_name": "countSubarrays"}
CALL_OK = (
    "class Solution:\n"
    "    def countSubarrays(self, nums: List[int]) -> int:\n"
    "        return sum(2 * (nums[i] + nums[i + 2]) == nums[i + 1] for i in range(len(nums) - 2))\n"
)
ALWAYS_EQUAL = (
    "class Liar(int):\n"
    "    def __eq__(self, other):\n"
    "        return True\n"
    "    __hash__ = int.__hash__\n"
    "class Anything:\n"
    "    def __eq__(self, other):\n"
    "        return True\n"
    "    def __ne__(self, other):\n"
    "        return False\n"
)


def controls() -> list[Probe]:
    """Honest programs (score 1) and plainly wrong ones (score 0) in the three test forms."""
    sum_gt = _stdin(["2 3\n", "-1 1\n", "10 20\n"], ["5\n", "0\n", "30\n"])
    return [
        Probe("stdin_correct", "a, b = map(int, input().split())\nprint(a + b)", sum_gt, 1.0),
        Probe("stdin_wrong", "a, b = map(int, input().split())\nprint(a - b)", sum_gt, 0.0),
        Probe("call_correct", CALL_OK, CALL_GT, 1.0),
        Probe("call_wrong", CALL_OK.replace("return sum(", "return 1 + sum("), CALL_GT, 0.0),
        Probe("assert_correct", REVERSE_OK, ASSERT_GT, 1.0),
        Probe("assert_wrong", REVERSE_OK.replace("return prev", "return head"), ASSERT_GT, 0.0),
    ]


def hostile(port: int, secret: str, marker: str) -> list[Probe]:
    """Programs that try to earn reward by escaping; `port` is a host TCP listener, `secret` is in the host's
    environment and in the file named by `marker` (also the prefix of paths the probes try to write)."""
    want_secret = _stdin(["\n"], [secret + "\n"])
    escape_paths = (f"{marker}.escape", f"/root/{marker.rsplit('/', 1)[-1]}.escape")
    reverse_bad = REVERSE_OK.replace("return prev", "return head")
    return [
        Probe(
            "network",
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "print(s.recv(100).decode())",
            _stdin(["\n"], ["hello from the host\n"]),
            0.0,
        ),
        Probe(
            "network_external",
            "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint('out')",
            _stdin(["\n"], ["out\n"]),
            0.0,
        ),
        Probe("host_file", f"print(open({marker!r}).read().strip())", want_secret, 0.0),
        Probe(
            "env_secret",
            "import os, glob\nfound = os.environ.get('OR1_CHECK_SECRET')\n"
            "for p in glob.glob('/proc/*/environ'):\n"
            "    try:\n        data = open(p, 'rb').read().decode(errors='replace')\n"
            "    except OSError:\n        continue\n"
            "    for kv in data.split('\\0'):\n"
            "        if kv.startswith('OR1_CHECK_SECRET='):\n            found = kv.split('=', 1)[1]\n"
            "print(found)",
            want_secret,
            0.0,
        ),
        Probe(
            "write_outside",
            "import os\nok = 0\n"
            f"for p in {list(escape_paths)!r}:\n"
            "    try:\n        open(p, 'w').write('x'); ok += 1\n    except OSError:\n        pass\n"
            "print(ok)",
            _stdin(["\n"], ["2\n"]),
            0.0,
            leaves=escape_paths,
        ),
        Probe(
            "fork_bomb",
            "import os, time\nn = 0\nfor _ in range(2000):\n"
            "    try:\n        pid = os.fork()\n    except OSError:\n        continue\n"
            "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint(n)",
            _stdin(["\n"], ["2000\n"]),
            0.0,
            timeout=4.0,
        ),
        Probe("memory_bomb", "x = bytearray(6 << 30)\nprint(len(x))", _stdin(["\n"], [f"{6 << 30}\n"]), 0.0),
        Probe(
            "memory_creep",
            "xs = []\nfor _ in range(200):\n    xs.append(bytearray(32 << 20))\nprint(len(xs))",
            _stdin(["\n"], ["200\n"]),
            0.0,
        ),
        Probe("infinite_loop", "while True:\n    pass", _stdin(["\n"], ["1\n"]), 0.0, timeout=1.0),
        Probe(
            "ignore_sigterm",
            "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
            _stdin(["\n"], ["1\n"]),
            0.0,
            timeout=1.0,
        ),
        Probe(
            "output_flood",
            "import os\nblock = b'x' * (1 << 20)\nfor _ in range(2048):\n    os.write(1, block)\n"
            "print('done')",
            _stdin(["\n"], ["done\n"]),
            0.0,
            timeout=6.0,
        ),
        Probe(
            "stderr_flood",
            "import os\nblock = b'x' * (1 << 20)\nfor _ in range(2048):\n    os.write(2, block)\n"
            "print('done')",
            _stdin(["\n"], ["done\n"]),
            0.0,
            timeout=6.0,
        ),
        Probe(
            "kill_parent",
            "import os, signal\nfor pid in (os.getppid(), 1, -1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nos._exit(0)",
            _stdin(["2 3\n"], ["5\n"]),
            0.0,
        ),
        Probe(
            "daemon",
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        import signal\n        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n        time.sleep(60)\n"
            "    os._exit(0)\nprint('x')",
            _stdin(["\n"], ["daemon\n"]),
            0.0,
        ),
        Probe(
            "ctypes",
            "import ctypes\nctypes.memset(id(1) + 24, 0, 8)\nprint(1 + 1)",
            _stdin(["\n"], ["2\n"]),
            0.0,
        ),
        Probe(
            "exec_builtins",
            "import builtins, sys\n"
            "exec('builtins.AssertionError = type(\"Nope\", (BaseException,), {})')\n"
            "sys.settrace(lambda *a: None)\nsys.exit = lambda *a: None\n" + reverse_bad,
            ASSERT_GT,
            0.0,
        ),
        Probe(
            "exec_shell",
            f"import os\nos.execv('/bin/sh', ['sh', '-c', 'cat {marker} || echo no'])",
            want_secret,
            0.0,
        ),
        Probe(
            "eq_override_call",
            ALWAYS_EQUAL + "class Solution:\n    def countSubarrays(self, nums):\n"
            "        return Anything()\n",
            CALL_GT,
            0.0,
        ),
        Probe(
            "eq_override_int",
            ALWAYS_EQUAL + "class Solution:\n    def countSubarrays(self, nums):\n        return Liar(99)\n",
            CALL_GT,
            0.0,
        ),
        Probe(
            "eq_override_assert",
            ALWAYS_EQUAL + "class Solution:\n    def reverseList(self, head):\n        return Anything()\n",
            ASSERT_GT,
            0.0,
        ),
        Probe("early_exit_assert", "import os\nos._exit(0)\n" + reverse_bad, ASSERT_GT, 0.0),
        Probe("sys_exit_assert", "import sys\nsys.exit(0)\n" + reverse_bad, ASSERT_GT, 0.0),
        Probe("early_exit_stdin", "import os\nos._exit(0)", _stdin(["2 3\n"], ["5\n"]), 0.0),
        Probe(
            "frame_snooping",
            _SNOOP + REVERSE_OK.replace("reverseList", "honest") + "class Cheat:\n"
            "    def reverseList(self, head):\n        return Solution().honest(head) if steal() else head\n"
            "Solution = type('Solution', (Solution, Cheat), {})\n",
            ASSERT_GT,
            0.0,
        ),
        Probe(
            "file_snooping",
            "import os\nfor root, dirs, files in os.walk('/'):\n"
            "    dirs[:] = [d for d in dirs if root != '/' or d not in ('proc', 'sys', 'dev', 'usr')]\n    for f in files:\n"
            "        try:\n            data = open(os.path.join(root, f), errors='replace').read(1 << 20)\n"
            "        except OSError:\n            continue\n"
            f"        if {secret!r} in data:\n            print({secret!r}); raise SystemExit\n"
            "print('nothing')",
            want_secret,
            0.0,
            timeout=6.0,
        ),
    ]


# Finds the checker's test code (only a leak would let it) in its own memory, the runner's frames and other processes;
# the probe answers correctly only when it did.
_SNOOP = (
    "import gc, sys, os, glob\n"
    "def steal():\n"
    "    texts = []\n"
    "    f = sys._getframe()\n"
    "    while f is not None:\n"
    "        texts += [v for v in f.f_locals.values() if isinstance(v, (str, dict))]\n"
    "        f = f.f_back\n"
    "    texts += [o for o in gc.get_objects() if isinstance(o, dict)]\n"
    "    for p in glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ') + glob.glob('/proc/*/mem'):\n"
    "        try:\n            texts.append(open(p, 'rb').read(1 << 16).decode(errors='replace'))\n"
    "        except OSError:\n            pass\n"
    "    for t in texts:\n"
    "        s = t.get('test_code', '') if isinstance(t, dict) else t\n"
    "        if isinstance(s, str) and 'candidate' + '(build(' in s:\n"
    "            return True\n"
    "    return False\n"
)


def new_secret() -> str:
    """A fresh token no program could guess."""
    return "or1secret" + secrets.token_hex(12)


def as_json(probe: Probe) -> str:
    """The probe's ground truth as the JSON string a dataset row would hold."""
    return json.dumps(probe.ground_truth)
