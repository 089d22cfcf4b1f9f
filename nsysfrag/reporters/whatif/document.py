"""The what-if report as JSON-ready data (schema ``nsysfrag-whatif/1``), deterministic for a
given input."""

from __future__ import annotations

import json
from typing import Any

from nsysfrag.allocators.base import UNLIMITED
from nsysfrag.reporters.json_report import state_document
from nsysfrag.reporters.whatif.driver_document import driver_document
from nsysfrag.reporters.whatif.words import recommendation_text, reference_text
from nsysfrag.whatif import (
    VALIDATION_TARGET_MATCH,
    VALIDATION_TARGET_PEAK,
    PolicyOutcome,
    Recommendation,
    SpaceComparison,
    Validation,
    WhatifReport,
)

SCHEMA = "nsysfrag-whatif/1"


def policy_document(o: PolicyOutcome, rank: int, pytorch: bool = True) -> dict[str, Any]:
    """One policy's row; ``pytorch=False`` for a program that does not run PyTorch's allocator
    (no PYTORCH_CUDA_ALLOC_CONF selects anything there)."""
    return {
        "policy": o.name,
        "family": o.policy.family,
        "description": o.policy.description,
        "options": o.policy.option_summary,
        "alloc_conf": o.policy.alloc_conf() if pytorch else None,
        "rank": rank,
        "baseline": o.baseline,
        "model": o.name,
        "peak": state_document(o.peak),
        "max": {
            "global_frag": o.max_global_frag,
            "local_frag": o.max_local_frag,
            "free_blocks": o.max_free_blocks,
            "live_bytes": o.max_live_bytes,
        },
        "final": state_document(o.final),
        "health": o.health.label,
        "internal_frag": o.internal_frag,
        "growth_per_s": o.growth_per_s,
        "peak_reserved_bytes": o.peak_reserved_bytes,
        "final_reserved_bytes": o.final_reserved_bytes,
        "peak_requested_bytes": o.peak_requested_bytes,
        "reserved_over_requested_at_peak": o.reserved_over_requested_at_peak,
        "max_reserved_over_max_requested": o.max_reserved_over_max_requested,
        "simulated_ooms": o.simulated_ooms,
        "first_oom_time_ns": o.first_oom_time_ns,
        "largest_free_at_oom_bytes": o.largest_free_at_oom_bytes,
    }


def space_document(s: SpaceComparison) -> dict[str, Any]:
    rec = s.recommendation
    return {
        "label": s.label,
        "pid": s.pid,
        "device": s.device,
        "capacity_bytes": s.capacity_bytes,
        "capacity_source": s.capacity_source,
        "capacity_basis": s.capacity_basis,
        "requests": s.requests,
        "frees": s.frees,
        "counts": {
            "allocations": s.counts.allocations,
            "frees": s.counts.frees,
            "failed_allocations": s.counts.failed_allocations,
        },
        "peak_requested_bytes": s.peak_requested_bytes,
        "first_event_ns": s.first_time_ns,
        "streams": s.streams,
        "timestamps": s.timestamps,
        "recorded_peak_reserved_bytes": s.recorded_peak_reserved_bytes,
        "warnings": s.warnings,
        "baseline": rec.baseline,
        "baseline_peak_reserved_bytes": rec.baseline_peak_reserved_bytes,
        "model_error": rec.model_error,
        "model_error_basis": rec.error_basis,
        "ranking": [o.name for o in s.outcomes],
        "recommendation": recommendation_document(rec),
        "worth_trying": worth_trying_document(rec),
        "fewer_ooms": fewer_ooms_document(rec),
        "advice": {
            "text": recommendation_text(rec),
            "alloc_conf": rec.chosen.alloc_conf if rec.chosen else None,
            "threshold": rec.threshold,
            "reference": reference_text(rec),
        },
        "driver": driver_document(rec.driver),
        "policies": [
            policy_document(o, i + 1, rec.driver is None) for i, o in enumerate(s.outcomes)
        ],
    }


def recommendation_document(rec: Recommendation) -> dict[str, Any] | None:
    """The contract's ``recommendation``: null, or the policy to switch to, why (``reason``:
    ``fewer_ooms`` before any saving, else ``saving``) and what it saves or costs."""
    c = rec.chosen
    if c is None:
        return None
    return {
        "policy": c.policy,
        "reason": rec.reason,
        "saving_bytes": c.saving_bytes,
        "saving_ratio": c.saving_ratio,
        "model_error": c.model_error,  # the recommended policy's own model's error
        "validated": True,
        "simulated_ooms": c.simulated_ooms,
        "baseline_ooms": rec.baseline_ooms,
        "recorded_failures": rec.recorded_failures,
        "peak_reserved_bytes": c.peak_reserved_bytes,
        # What avoiding the failures costs (fewer_ooms): more peak reserved; 0 when it saves.
        "cost_bytes": max(-c.saving_bytes, 0),
        "cost_ratio": max(-c.saving_ratio, 0.0),
    }


def worth_trying_document(rec: Recommendation) -> dict[str, Any] | None:
    """A policy whose model was not validated on this input but that would save more than the
    recommendation (or than 1 %): worth trying, not validated; never the recommendation."""
    c = rec.worth_trying
    if c is None:
        return None
    return {
        "policy": c.policy,
        "alloc_conf": c.alloc_conf,
        "saving_bytes": c.saving_bytes,
        "saving_ratio": c.saving_ratio,
        "simulated_ooms": c.simulated_ooms,
        "validated": False,
        "model_error": None,
    }


def fewer_ooms_document(rec: Recommendation) -> dict[str, Any] | None:
    """Nothing recommended, but a policy a user can switch to has fewer simulated OOMs than the
    baseline: which, and what it costs in peak reserved (not a ``recommendation``: the truth
    rule recommends savings only)."""
    c = rec.fewer_ooms
    if c is None or rec.chosen is not None:
        return None
    return {
        "policy": c.policy,
        "alloc_conf": c.alloc_conf,
        "simulated_ooms": c.simulated_ooms,
        "baseline_ooms": rec.baseline_ooms,
        "peak_reserved_bytes": c.peak_reserved_bytes,
        "cost_bytes": -c.saving_bytes,
        "cost_ratio": -c.saving_ratio,
        "validated": c.validated,
    }


def validation_document(v: Validation) -> dict[str, Any]:
    return {
        "model": "torch",
        "settings": v.settings,
        "segment_alloc_match": v.segment_alloc_match,
        "peak_reserved_simulated_bytes": v.peak_reserved_simulated_bytes,
        "peak_reserved_recorded_bytes": v.peak_reserved_recorded_bytes,
        "peak_reserved_error": v.peak_error,
        "meets_target": v.meets_target,
        "target": {
            "segment_alloc_match": VALIDATION_TARGET_MATCH,
            "peak_reserved_error": VALIDATION_TARGET_PEAK,
        },
        "devices": [
            {
                "device": d.device,
                "compared_action": d.action,
                "recorded_segment_allocs": d.recorded_segment_allocs,
                "simulated_segment_allocs": d.simulated_segment_allocs,
                "matched_segment_allocs": d.matched_segment_allocs,
                "segment_alloc_match": d.segment_alloc_match,
                "peak_reserved_recorded_bytes": d.peak_reserved_recorded_bytes,
                "peak_reserved_simulated_bytes": d.peak_reserved_simulated_bytes,
                "peak_reserved_error": d.peak_error,
                "initial_reserved_bytes": d.initial_reserved_bytes,
                "requests": d.requests,
                "capacity_bytes": d.capacity_bytes if d.capacity_bytes < UNLIMITED else None,
                "capacity_source": d.capacity_source,
                "recorded_oom_paths": d.recorded_oom_paths,
                "simulated_oom_paths": d.simulated_oom_paths,
                "empty_cache_calls": d.empty_cache_calls,
                "release_bursts": d.release_counts,
                "note": d.note,
            }
            for d in v.devices
        ],
    }


def document(report: WhatifReport) -> dict[str, Any]:
    """The whole report as JSON-ready data (deterministic for a given input)."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "input": {
            "path": report.input_path,
            "kind": report.input_kind,
            "request_level": report.request_level,
            "notes": report.notes,
        },
        "spaces": [space_document(s) for s in report.spaces],
    }
    if report.validation is not None:
        doc["validation"] = validation_document(report.validation)
    return doc


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
