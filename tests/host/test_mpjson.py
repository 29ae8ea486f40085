"""ternlab.boards.mpjson reads a text as MicroPython's json does (the board's reading of config.json,
which tern deploy's check reports): compared with the unix port's own json.loads on texts that
CPython's json refuses and on seeded random ones."""

import random
import subprocess
import sys
from pathlib import Path

from ternlab.boards.mpjson import loads

MICROPYTHON = str(Path(sys.executable).with_name("micropython"))
TEXTS = [
    '{"a": 1,}', '{"a": 1 "b": 2}', '{"a" 1}', '{"a": 1, "b"}', '[1,,2,]', '{"a": }', '{,}', '{"a": 1}}',
    '{"a": {"b"}, "c": 1}', '"x\\u0041\\n\\t\\q"', '1 2', ' 12 \n', '{"a": [1}', '{"a": tru}', '-1.5e3', '{"a": 1-2}',
    '', '{', '[[]]', '{"k": null, "t": true, "f": false}', '{1: 2}', '{[1]: 2}', '{"a": 1}\n\x0b', '{"a": "\\u00e9"}',
    '{"host": "b",\n "port": 1883,\n}', '[1, [2, [3,],],]',
]


def micropython_reads(texts):
    src = ("import json\nfor t in %r:\n    try:\n        print(repr(json.loads(t)))\n"
           "    except Exception as e:\n        print('ERR')\n" % texts)
    r = subprocess.run([MICROPYTHON, "-c", src], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


BASES = ['{"host": "broker.lan", "port": 1883, "qos": [0, 1, 2], "tls": false, "ca": null, "x": -1.5e2}',
         '[{"a": {"b": [1, "c\\n"]}}, true, "\\u0041"]']


def mutated(rnd):
    """A base text with a few characters deleted, doubled or put in (commas, colons, brackets, quotes)."""
    t = list(rnd.choice(BASES))
    for _ in range(rnd.randint(1, 4)):
        i = rnd.randrange(len(t))
        op = rnd.random()
        if op < 0.4:
            del t[i]
        elif op < 0.6:
            t.insert(i, t[i])
        else:
            t.insert(i, rnd.choice(',,::]}["\\ '))
    return "".join(t)


def test_mpjson_reads_what_micropythons_json_reads():
    rnd = random.Random(38)
    alphabet = list('{}[],:" \n1a-.e\\tunl')
    texts = TEXTS + ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 14))) for _ in range(300)]
    texts += [mutated(rnd) for _ in range(600)]
    got = micropython_reads(texts)
    assert len(got) == len(texts)
    differ = []
    for text, mp in zip(texts, got):
        try:
            mine = loads(text)
        except ValueError:
            mine = "ERR"
        if (mp == "ERR") != (mine == "ERR") or mp != "ERR" and eval(mp) != mine:  # noqa: S307 - the port's repr
            differ.append((text, mp, mine))
    assert not differ, differ[:10]
    assert sum(g != "ERR" for g in got) > 150  # the random texts reach the lenient paths, not only errors
