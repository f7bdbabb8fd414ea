"""The arena report reads at a glance: its figures show the data they are given (axes chosen from the values,
not from the metric's name alone); one look (short name, color) per submission in every figure and table of a
report made from a real tiny arena run, the hyperparameters in a table of their own, each legend outside the
axes; and the HTML page, rendered by headless Chromium, shows every figure whole (``.ci/run`` installs
Chromium; elsewhere the browser test is skipped when none is found, and in CI that is a failure)."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess

import matplotlib.figure
import pytest
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D

from gradwise import cli
from gradwise.arena.figures import plot_curves
from gradwise.arena.rulesets import Entry, plan, self_tuning_entry, work
from gradwise.arena.store import Store
from gradwise.arena.styles import LINESTYLES, PALETTE, looks, short_names


@pytest.mark.parametrize("metric,values,target,log", [
    ("loss", [2.5, 2.3, 2.1, 2.05], 2.08, False),      # a narrow loss range: linear, every point inside
    ("mse", [1.0, 0.1, 0.01, 0.002], 0.001, True),     # spans decades: log
    ("accuracy", [0.5, 0.9, 0.97, 0.985], 0.98, False),  # zoomed on the approach to the target
])
def test_curves_axes_hold_the_curve_and_target(tmp_path, monkeypatch, metric, values, target, log):
    seen = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: seen.extend(fig.axes))
    curve = [{"step": 10 * i, "time": float(i), metric: v} for i, v in enumerate(values, 1)]
    record = {"study_index": 0, "time_to_target": None, "best_metric": values[-1], "curve": curve}
    plot_curves({"records": {("A", "w"): [record]}}, {"w": (target, metric)}, looks(["A"]), tmp_path / "c.png")
    [ax] = seen
    low, high = ax.get_ylim()
    assert (ax.get_yscale() == "log") == log
    assert low <= target <= high and low <= values[-1] <= high
    if metric != "accuracy":
        assert low <= min(values) and max(values) <= high


def test_short_names_and_colors_depend_on_the_set_alone():
    names = ['torch.SGD{"lr"=0.1,"momentum"=0.9}', "AdamW", 'torch.SGD{"lr"=0.3}', "torch.SGD", 'Lion{"lr"=1e-4}']
    assert short_names(names) == {"AdamW": "AdamW", 'Lion{"lr"=1e-4}': "Lion", "torch.SGD": "torch.SGD",
                                  'torch.SGD{"lr"=0.1,"momentum"=0.9}': "torch.SGD #1",
                                  'torch.SGD{"lr"=0.3}': "torch.SGD #2"}
    assert looks(names) == looks(reversed(names))  # whatever order the store or the scores give
    many = looks(f"opt{i:02d}" for i in range(25))
    assert [look.color for look in many.values()][:20] == list(PALETTE) and len(set(PALETTE)) == 20
    assert [look.linestyle for look in many.values()] == [LINESTYLES[0]] * 10 + [LINESTYLES[1]] * 10 + \
        [LINESTYLES[2]] * 5  # past 20 the colors repeat, the dotted line tells them apart


def _colors(artist) -> set[str]:
    """A line's color, or a bar's fill and edge (a miss is a white bar with a colored, hatched edge)."""
    if isinstance(artist, Line2D):
        return {to_hex(artist.get_color())}
    return {to_hex(artist.get_facecolor()), to_hex(artist.get_edgecolor())}


def _summary(fig) -> dict:
    """What a reader sees of a saved figure: its legends' and panels' boxes, legend entries (label and color;
    none for the hatched miss key), and each submission artist's colors."""
    renderer = fig.canvas.get_renderer()
    entries = []
    for legend in fig.legends:
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            color = None if getattr(handle, "get_hatch", lambda: None)() else \
                to_hex(handle.get_color() if isinstance(handle, Line2D) else handle.get_facecolor())
            entries.append((text.get_text(), color))
    return {"legends": [legend.get_window_extent(renderer) for legend in fig.legends],
            "axis_legends": [ax.get_legend() is not None for ax in fig.axes],
            "panels": [ax.get_window_extent(renderer) for ax in fig.axes], "entries": entries,
            "artists": [(a.get_gid(), _colors(a)) for ax in fig.axes for a in [*ax.lines, *ax.patches] if a.get_gid()]}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A real tiny arena run on two workloads: AdamW and torch.SGD at their self-tuning points, torch.SGD at a
    point given as ``--hyperparameters`` gives it (so two submissions shorten to the same name), and SGD over a
    search space; then ``gradwise arena report``, each saved figure summarised as it is saved."""
    tmp = tmp_path_factory.mktemp("arena")
    db, out = tmp / "a.db", tmp / "report"
    point = {"lr": 0.2, "momentum": 0.9}
    entries = [self_tuning_entry("AdamW"), self_tuning_entry("torch.SGD"),
               Entry(f"torch.SGD{json.dumps(point, separators=(',', '='))}", "torch.SGD", hyperparameters=point),
               Entry("SGD:sgd", "SGD", space={"lr": {"min": 0.02, "max": 0.2, "scaling": "log"}})]
    scales = {"lstsq_ill_conditioned": 0.1, "teacher_student": 0.02}  # SGD reaches the first target, not the other
    work(Store(str(db)), [p for e in entries for w, scale in scales.items()
                          for p in plan(e, w, studies=1, trials=2, budget_scale=scale, time_limit=False)])
    saved = {}
    original = matplotlib.figure.Figure.savefig

    def save(fig, path, *args, **kwargs):
        original(fig, path, *args, **kwargs)
        saved[path.name] = _summary(fig)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", save)
        assert cli.main(["arena", "report", "--storage", str(db), "--out", str(out)]) == 0
    return {"out": out, "figures": saved, "studies": Store(str(db)).studies()}


def test_one_look_per_submission_in_every_figure(report):
    styles = looks(s["spec"]["submission"] for s in report["studies"])
    assert [look.short for look in styles.values()] == ["AdamW", "SGD:sgd", "torch.SGD", "torch.SGD #1"]
    figures = report["figures"]
    assert len(figures) == 10  # five per ruleset
    for name, fig in figures.items():
        assert fig["artists"], name
        for gid, colors in fig["artists"]:  # every line and bar in its submission's color
            assert styles[gid].color in colors, (name, gid)
        shorts = [(label, color) for label, color in fig["entries"] if label != "target" and color is not None]
        shown = {gid for gid, _ in fig["artists"]}
        assert shorts == [(styles[n].short, styles[n].color) for n in styles if n in shown], name  # same order
        [legend] = fig["legends"]  # one legend, the figure's, beside the panels: never over data
        assert not any(fig["axis_legends"]), name
        for panel in fig["panels"]:
            assert not legend.overlaps(panel) and legend.x0 >= panel.x1, name


def test_tables_use_short_names_and_list_the_hyperparameters(report):
    text = (report["out"] / "report.md").read_text()
    assert '{"lr"' not in text and "| 1 |" in text
    assert "| torch.SGD #1 | torch.SGD | lr=0.2, momentum=0.9 |" in text
    assert "| torch.SGD | torch.SGD | lr=0.05, momentum=0.9, nesterov=true, weight_decay=1e-05," in text
    assert "| SGD:sgd | SGD | lr in [0.02, 0.2] log |" in text
    page = (report["out"] / "report.html").read_text()
    for look in looks(s["spec"]["submission"] for s in report["studies"]).values():
        assert f"background:{look.color}'></span>{html.escape(look.short)}</td>" in page


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    reason = "no Chromium found (chromium, chromium-browser, google-chrome); apt-get install chromium"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test: {reason}; .ci/run installs it")
    pytest.skip(reason)


PROBE = """<script>addEventListener("load", () => { const probe = document.createElement("pre");
probe.id = "probe"; probe.textContent = JSON.stringify({width: innerWidth, scrollWidth:
document.documentElement.scrollWidth, height: document.documentElement.scrollHeight, images: [...document.images]
.map(i => ({src: i.getAttribute("src"), natural: [i.naturalWidth, i.naturalHeight], shown: [i.width, i.height],
at: [i.getBoundingClientRect().left + scrollX, i.getBoundingClientRect().top + scrollY]}))});
document.body.appendChild(probe); });</script>"""


def test_html_report_in_headless_chromium(report, tmp_path):
    from PIL import Image, ImageChops

    browser, out = _chromium(), report["out"]
    run = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1",
           f"--user-data-dir={tmp_path / 'profile'}"]
    (out / "probe.html").write_text((out / "report.html").read_text() + PROBE)
    dom = subprocess.run([*run, "--window-size=1280,900", "--dump-dom", (out / "probe.html").as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    page = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    assert page["scrollWidth"] <= page["width"] == 1280  # nothing wider than the window: no cut-off table
    figures = re.findall(r'<img src="([^"]+)"', (out / "report.html").read_text())
    assert [i["src"] for i in page["images"]] == figures and len(figures) == 10
    for image in page["images"]:  # loaded, and shown at its own size (figures fit the page's 1200 px)
        assert image["natural"] == list(Image.open(out / image["src"]).size) == image["shown"], image
    shot = tmp_path / "report.png"
    subprocess.run([*run, f"--window-size=1280,{page['height']}", f"--screenshot={shot}", (out / "report.html")
                    .as_uri()], capture_output=True, timeout=120, check=True)
    screen = Image.open(shot).convert("RGB")
    assert screen.size == (1280, page["height"])
    colors = screen.getcolors(1 << 24)  # text, tables and figures, not a blank page
    white = dict((c, n) for n, c in colors).get((255, 255, 255), 0)
    assert len(colors) > 200 and white < 0.95 * screen.width * screen.height
    for image in page["images"]:  # the screenshot shows each figure, pixel for pixel
        left, top = (round(v) for v in image["at"])
        png = Image.open(out / image["src"]).convert("RGB")
        shown = screen.crop((left, top, left + png.width, top + png.height))
        diff = ImageChops.difference(shown, png).getextrema()
        assert max(high for _, high in diff) <= 8, (image["src"], diff)
