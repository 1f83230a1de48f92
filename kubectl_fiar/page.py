"""View model to one self-contained HTML page (``kubectl fiar report --html FILE``). Pure, no I/O.

No script, no font, no image, nothing fetched: inline CSS only, so the page opens offline and from
a mail attachment. A grid of nodes coloured by verdict, grouped by GPU model and NVLink clique
(hover a cell for its reason), the counts, each policy's pods, what needs attention, and a table of
every node with its reason. Every value is HTML-escaped (a forged label cannot add markup).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from html import escape
from typing import Final

import fiar_contract as contract
from kubectl_fiar import model, render
from kubectl_fiar.model import INVALID, UNPROBED, Fleet, NodeView

COLOURS: Final = {
    "mnnvl": "#1a7f37",
    "trtllm": "#54aeff",
    "none": "#d4a72c",
    UNPROBED: "#8c959f",
    INVALID: "#cf222e",
}
"""Cell colour per verdict (the Chromium test reads these back from the rendered page)."""

_CSS: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1f2328;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}h3{font-size:13px;margin:12px 0 4px;color:#57606a}
.counts span,.legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-1px;margin-right:4px}
.models{display:flex;flex-wrap:wrap;gap:8px 40px}.model h2{margin-top:12px}
.grid{display:flex;flex-wrap:wrap;gap:3px;max-width:1100px}
.node{width:18px;height:18px;border-radius:3px;display:inline-block}
.node:hover{outline:2px solid #1f2328}
table{border-collapse:collapse;font-size:12px}
td,th{border-bottom:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}.muted{color:#57606a}
"""


def _sw(verdict: str) -> str:
    return f'<span class="sw" style="background:{COLOURS[verdict]}"></span>'


def _cell(n: NodeView) -> str:
    title = f"{n.name}: {n.verdict} ({n.gpus} GPUs, multicast {n.multicast}) — {n.reason}"
    return (
        f'<span class="node" data-node="{escape(n.name)}" data-verdict="{escape(n.verdict)}" '
        f'title="{escape(title)}" style="background:{COLOURS[n.verdict]}"></span>'
    )


def _rows(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str) -> str:
    h = "".join(f"<th>{escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def html(f: Fleet, scope: str) -> str:
    when = dt.datetime.fromtimestamp(f.now, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    counts = f.counts()
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        "<title>fiar fleet</title>",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<style>{_CSS}</style></head><body>",
        "<h1>fiar: verified FlashInfer allreduce backends</h1>",
        f'<div class="muted">{escape(when)} — {len(f.nodes)} GPU nodes, managed pods of {escape(scope)}</div>',
        '<h2>Nodes by verdict</h2><div class="counts" id="counts">',
    ]
    for verdict in model.VERDICT_ORDER:
        if verdict in counts:
            parts.append(
                f'<span data-verdict="{verdict}" data-count="{counts[verdict]}">{_sw(verdict)}'
                f"{escape(render.VERDICT_WORDS[verdict])}: <b>{counts[verdict]}</b></span>"
            )
    parts.append("</div>")
    parts.append('<div class="models">')
    by_model: dict[str, dict[str, list[NodeView]]] = {}
    for n in f.nodes:
        by_model.setdefault(n.model, {}).setdefault(n.clique, []).append(n)
    for gpu_model in sorted(by_model):
        cliques = by_model[gpu_model]
        total = sum(len(v) for v in cliques.values())
        parts.append(f'<section class="model"><h2>{escape(gpu_model)} ({total})</h2>')
        for clique in sorted(cliques):
            nodes = sorted(cliques[clique], key=lambda n: (model.VERDICT_ORDER.index(n.verdict), n.name))
            label = "no NVLink clique" if clique == "-" else f"clique {clique}"
            parts.append(f'<h3>{escape(label)} ({len(nodes)})</h3><div class="grid">')
            parts.extend(_cell(n) for n in nodes)
            parts.append("</div>")
        parts.append("</section>")
    parts.append('</div><div class="legend" style="margin-top:12px">')
    parts.extend(f"<span>{_sw(v)}{escape(render.VERDICT_WORDS[v])}</span>" for v in model.VERDICT_ORDER)
    parts.append("</div><h2>Policies</h2>")
    if f.policies:
        rows = render.policy_rows(f.policies)
        parts.append(_rows(rows[0], rows[1:], "policies"))
    else:
        parts.append("<p>No FiAllreducePolicy: no pod is managed by fiar.</p>")
    parts.append(f"<h2>Needs attention ({len(f.attention)})</h2>")
    if f.attention:
        parts.append(
            _rows(["what", "where", "why"], ([a.kind, a.subject, a.message] for a in f.attention), "attention")
        )
    else:
        parts.append("<p>Nothing needs attention.</p>")
    parts.append("<h2>Every node</h2>")
    head = ["node", "verdict", "GPU model", "GPUs", "multicast", *contract.BACKENDS, "clique", "probed", "reason"]
    node_rows = (
        [
            n.name,
            n.verdict,
            n.model,
            n.gpus,
            n.multicast,
            *(n.results[b] for b in contract.BACKENDS),
            n.clique,
            model.age(n.age_s(f.now)),
            n.reason,
        ]
        for n in f.nodes
    )
    parts.append(_rows(head, node_rows, "nodes"))
    parts.append("</body></html>\n")
    return "".join(parts)
