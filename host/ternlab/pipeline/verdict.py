"""The delivery verdict: the one rule that says whether a run kept Tern's promise. The Spark audit,
``tern fleet run`` (its own landing and observer counts) and ``tern demo`` all judge with it.

Fails when any QoS >= 1 message is lost (accepted by ``publish()``, never delivered) or any QoS 2
message is duplicated (delivered, or landed, more than once). QoS 0 may be lost, QoS 1 duplicated
(at least once). Reorderings are counted and listed (per subscriber stream, see
:func:`.audit.messages`) but do not fail it. Plain Python: no Spark needed to judge.
"""


def verdict(per_qos: dict) -> dict:
    """``{"ok": bool, "reasons": [...]}`` from per-QoS counts ``{qos: {"lost": n, "duplicated": n}}``
    (QoS as int or string; a missing count is 0)."""
    reasons = []
    for q, row in sorted(per_qos.items(), key=lambda kv: int(kv[0])):
        lost, dup = int(row.get("lost") or 0), int(row.get("duplicated") or 0)
        if int(q) >= 1 and lost > 0:
            reasons.append(f"QoS {q}: {lost} message(s) lost")
        if int(q) == 2 and dup > 0:
            reasons.append(f"QoS {q}: {dup} message(s) duplicated")
    return {"ok": not reasons, "reasons": reasons}
