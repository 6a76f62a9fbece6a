"""The Grafana dashboard (deploy/grafana/vllm-luce.json) and the Prometheus alert rules
(deploy/prometheus/vllm-luce-alerts.yml) against the metric catalogue: every PromQL expression names only
families that exist, written as /metrics exposes them (counters with `_total`), with labels those families
have; every catalogue family is charted; the files are well formed; docs/metrics.md lists every alert."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_luce.config import SCHEMA
from vllm_luce.metrics.catalog import CATALOG, PFLASH_OUTCOMES, PREFIX

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "vllm-luce.json"
ALERTS = ROOT / "deploy" / "prometheus" / "vllm-luce-alerts.yml"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# Labels every series has: model_name from the producer, instance and job from Prometheus at scrape time.
COMMON_LABELS = {"model_name", "instance", "job"}
# vLLM's own families the dashboard charts for context: kind and labels besides model_name.
VLLM_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "num_requests_running": ("gauge", ("engine",)),
    "num_requests_waiting": ("gauge", ("engine",)),
    "prompt_tokens": ("counter", ("engine",)),
    "generation_tokens": ("counter", ("engine",)),
    "time_to_first_token_seconds": ("histogram", ("engine",)),
    "kv_cache_usage_perc": ("gauge", ("engine",)),
    "num_preemptions": ("counter", ("engine",)),
}
# Catalogue families the dashboard leaves out, each with the reason.
NOT_CHARTED: dict[str, str] = {
    "kvflash_uncut_decisions": "0 where vllm-luce's scheduler runs: a check of the load-and-fault suite, not charted",
    "kvflash_lost_chunks": "a bug counter, 0 on a sound server: alerted (LuceKVFlashBookkeepingBroken), not charted",
    "kvflash_host_over_reserved_chunks": "a bug counter, 0 on a sound server: alerted (LuceKVFlashBookkeepingBroken)",
    "kvflash_page_mismatches": "a diagnostic's bug counter (kvflash.verify_pages): alerted, as the two above",
}
# Label values from fixed sets: a matcher naming another value selects nothing.
LABEL_VALUES = {"outcome": PFLASH_OUTCOMES, "mode": ("spec", "plain")}  # mode: the gate's decisions (gate.py)
SUFFIXES = {"counter": {"_total": ()}, "histogram": {"_bucket": ("le",), "_sum": (), "_count": ()},
            "gauge": {"": ()}}
SEVERITIES = {"critical", "warning", "info"}
DURATION = re.compile(r"^(?=\d)(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")  # Prometheus' duration

METRIC = re.compile(r"(?<![\w:])(vllm:[A-Za-z0-9_:]+)(?:\s*\{([^}]*)\})?")
MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LABEL_VALUES_QUERY = re.compile(r"label_values\(\s*[^,]+,\s*(\w+)\s*\)")
SHOWN_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}|\$labels\.(\w+)")
SETTING = re.compile(r"\bluce\.(\w+)\.(\w+)\b")


def family_labels(metric: str) -> tuple[set[str] | None, str | None]:
    """The labels a series of `metric` (as PromQL writes it) may carry, or None and what is wrong with it."""
    if metric.startswith(PREFIX):
        name, families = metric[len(PREFIX):], {n: (kind, labels) for n, (kind, labels, _) in CATALOG.items()}
    else:
        name, families = metric[len("vllm:"):], VLLM_FAMILIES
    for family, (kind, labels) in families.items():
        for suffix, extra in SUFFIXES[kind].items():
            if name == family + suffix:
                return {*labels, *extra} | COMMON_LABELS, None
    if name in families:
        kind = families[name][0]
        return None, f"{metric} is a {kind}: write it as {metric}{'|'.join(SUFFIXES[kind])}"
    source = "vllm_luce/metrics/catalog.py" if metric.startswith(PREFIX) else "VLLM_FAMILIES in this test"
    return None, f"{metric} is not in {source}"


def value_problem(label: str, op: str, value: str) -> str | None:
    allowed = LABEL_VALUES.get(label)
    if allowed is None:
        return None
    if op in ("=", "!="):
        return None if value in allowed else f'{label}{op}"{value}": not a value of {label} {allowed}'
    dead = [alt for alt in value.split("|") if not any(re.fullmatch(alt, v) for v in allowed)]
    return f'{label}{op}"{value}": {dead} match no value of {label}' if dead else None


def problems(expr: str, shown: str = "") -> list[str]:
    """What is wrong with a PromQL expression and the labels its legend or annotations show."""
    out, known = [], set(COMMON_LABELS)
    found = list(METRIC.finditer(expr))
    if not found:
        out.append("names no vllm: metric")
    for match in found:
        labels, problem = family_labels(match.group(1))
        if problem:
            out.append(problem)
            continue
        known |= labels
        selector = match.group(2) or ""
        matchers = list(MATCHER.finditer(selector))
        if "".join(m.group(0) for m in matchers).strip() != selector.strip():
            out.append(f"cannot read the selector {{{selector}}}")
        for label, op, value in (m.groups() for m in matchers):
            if label not in labels:
                out.append(f"{match.group(1)} has no label {label} (it has {sorted(labels)})")
            elif (problem := value_problem(label, op, value)) is not None:
                out.append(problem)
    grouped = [label.strip() for clause in CLAUSE.findall(expr) for label in clause.split(",") if label.strip()]
    grouped += LABEL_VALUES_QUERY.findall(expr)
    shown_labels = [a or b for a, b in SHOWN_LABEL.findall(shown)]
    out += [f"label {label} is on none of its metrics" for label in grouped + shown_labels if label not in known]
    for opening, closing in ("()", "[]", "{}"):
        if expr.count(opening) != expr.count(closing):
            out.append(f"unbalanced {opening}{closing}")
    return out


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    """Every panel, rows included, and those inside collapsed rows."""
    out = []
    for panel in dashboard()["panels"]:
        out += [panel, *panel.get("panels", [])]
    return out


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def expressions() -> list[tuple[str, str, str]]:
    """(where, PromQL, text showing labels) for every dashboard target, variable query and alert."""
    out = [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"], t.get("legendFormat", ""))
           for p in panels() for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v["definition"], "") for v in dashboard()["templating"]["list"]
            if v["type"] == "query"]
    out += [(f"alert {r['alert']}", r["expr"], json.dumps(r.get("annotations", {}))) for r in alert_rules()]
    return out


def test_the_checker_finds_bad_names_labels_and_values():
    assert problems('rate(vllm:luce_dflash_drafts_total{model_name=~"$model_name"}[5m])', "{{model_name}}") == []
    assert problems("vllm:luce_pflash_queue_depth") == []
    assert problems("histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))") == []
    assert problems("vllm:luce_dflash_no_such_thing") == ["vllm:luce_dflash_no_such_thing is not in "
                                                          "vllm_luce/metrics/catalog.py"]
    assert "write it as" in problems("rate(vllm:luce_dflash_drafts[5m])")[0]
    assert problems("vllm:luce_pflash_queue_depth_total")  # a gauge has no _total
    assert problems('vllm:luce_kvflash_host_bytes{engine="0"}')  # rank, not engine
    assert problems("sum by (position) (vllm:luce_dflash_drafts_total)")
    assert problems("vllm:luce_kvflash_requests", "{{batch_le}}")
    assert problems('vllm:luce_pflash_prompts_total{outcome="deadlines"}')
    assert problems('vllm:luce_pflash_prompts_total{outcome=~"queue_full|skiped_.*"}')
    assert problems("sum(rate(vllm:luce_dflash_drafts_total[5m])")
    assert problems("vllm:no_such_vllm_metric")


def test_every_expression_names_catalogue_metrics_with_their_labels():
    found = [f"{where}: {p}" for where, expr, shown in expressions() for p in problems(expr, shown)]
    assert not found, "PromQL that does not match the metric catalogue:\n" + "\n".join(found)


def test_every_catalogue_family_is_charted_or_listed_with_a_reason():
    charted = {match.group(1) for p in panels() for t in p.get("targets", []) for match in METRIC.finditer(t["expr"])}
    families = {PREFIX + name + suffix: name for name, (kind, _, _) in CATALOG.items() for suffix in SUFFIXES[kind]}
    shown = {families[m] for m in charted if m in families}
    missing = sorted(set(CATALOG) - shown - set(NOT_CHARTED))
    assert not missing, f"catalogue families with no dashboard panel (chart them or add them to NOT_CHARTED): {missing}"
    stale = sorted(n for n in NOT_CHARTED if n not in CATALOG or n in shown)
    assert not stale, f"NOT_CHARTED names families that are charted or gone: {stale}"
    assert all(reason.strip() for reason in NOT_CHARTED.values())


def test_dashboard_panels_have_unique_ids_a_datasource_and_targets():
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(i for i in ids if ids.count(i) > 1)}"
    for panel in panels():
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        where = f"panel {panel['id']} {panel.get('title')!r}"
        assert panel.get("title") and panel.get("description"), f"{where} has no title or description"
        assert panel.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, f"{where}: datasource"
        targets = panel.get("targets") or []
        assert targets, f"{where} has no targets"
        assert len({t["refId"] for t in targets}) == len(targets), f"{where}: refIds repeat"
        for target in targets:
            assert target.get("datasource") == panel["datasource"] and target.get("expr"), f"{where}: {target}"


def test_dashboard_variables_select_the_datasource_and_the_model():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    model = variables["model_name"]
    assert model["type"] == "query" and model["datasource"]["uid"] == "${datasource}"
    assert model["query"]["query"] == model["definition"].strip()
    unfiltered = [f"panel {p['id']} {t['refId']}: {m.group(1)}" for p in panels() for t in p.get("targets", [])
                  for m in METRIC.finditer(t["expr"]) if 'model_name=~"$model_name"' not in (m.group(2) or "")]
    assert not unfiltered, f"selectors without model_name=~\"$model_name\": {unfiltered}"


def test_alert_rules_have_the_required_fields():
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    names = [group["name"] for group in document["groups"]]
    assert len(names) == len(set(names)), "alert groups repeat a name"
    alerts = [rule.get("alert") for rule in alert_rules()]
    assert len(alerts) == len(set(alerts)), "alert names repeat"
    for rule in alert_rules():
        where = f"alert {rule.get('alert')!r}"
        assert re.fullmatch(r"Luce[A-Z][A-Za-z]+", rule.get("alert") or ""), f"{where}: name"
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, f"{where}: unknown fields"
        assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), f"{where}: expr"
        assert isinstance(rule.get("for"), str) and DURATION.match(rule["for"]), f"{where}: for {rule.get('for')!r}"
        assert rule.get("labels", {}).get("severity") in SEVERITIES, f"{where}: labels.severity"
        annotations = rule.get("annotations", {})
        assert annotations.get("summary", "").strip() and annotations.get("description", "").strip(), where


def test_duration_pattern():
    assert all(DURATION.match(d) for d in ("5m", "15m", "1h30m", "0s", "90s", "1d"))
    assert not any(DURATION.match(d) for d in ("", "5", "m", "5 m", "5min", "1m1h"))


def settings_named(text: str) -> set[str]:
    return {f"luce.{section}.{key}" for section, key in SETTING.findall(text)}


def test_every_alert_says_which_setting_to_change_and_the_settings_exist():
    texts = [(f"alert {r['alert']}", r["annotations"]["description"]) for r in alert_rules()]
    assert all(settings_named(text) for _, text in texts), "an alert's description names no luce.<section>.<key>"
    texts += [(f"panel {p['id']}", p.get("description", "")) for p in panels()]
    texts.append(("docs/metrics.md", METRICS_DOC.read_text()))
    unknown = [f"{where}: {name}" for where, text in texts for name in sorted(settings_named(text))
               if name.split(".")[1] not in SCHEMA
               or name.split(".")[2] not in {"enabled", *SCHEMA[name.split(".")[1]]}]
    assert not unknown, f"settings that vllm_luce/config.py's SCHEMA does not have: {unknown}"


def test_docs_table_lists_every_alert():
    documented = set(re.findall(r"^\| `(Luce\w+)` \|", METRICS_DOC.read_text(), re.M))
    alerts = {r["alert"] for r in alert_rules()}
    assert documented == alerts, (f"docs/metrics.md's alert table is out of date: missing "
                                  f"{sorted(alerts - documented)}, stale {sorted(documented - alerts)}")


def test_the_vllm_families_the_dashboard_uses_exist_in_the_installed_vllm():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    source = "".join(p.read_text() for p in (Path(spec.submodule_search_locations[0]) / "v1").rglob("*.py")
                     if "metrics" in p.parts or p.name == "metrics.py")
    missing = sorted(n for n in VLLM_FAMILIES if f'"vllm:{n}"' not in source)
    assert not missing, f"vLLM families this vLLM does not define: {missing}"


def test_promtool_accepts_the_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    result = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
