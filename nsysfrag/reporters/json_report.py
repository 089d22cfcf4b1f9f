"""The SPEC §6 JSON document (schema ``nsysfrag/1``)."""

from __future__ import annotations

import json
from typing import Any

from nsysfrag.analysis import Analysis, Bucket, SpaceAnalysis, State
from nsysfrag.analysis.advice import advise
from nsysfrag.analysis.metrics import size_class_label

SCHEMA = "nsysfrag/1"


def _state(s: State) -> dict[str, Any]:
    return {
        "time_ns": s.time_ns,
        "global_frag": s.global_frag,
        "local_frag": s.local_frag,
        "free_blocks": s.free_blocks,
        "largest_free_bytes": s.largest_free_bytes,
        "free_bytes": s.free_bytes,
        "live_bytes": s.live_bytes,
    }


def _buckets(buckets: list[Bucket]) -> list[dict[str, int]]:
    return [
        {"lo_bytes": b.lo_bytes, "hi_bytes": b.hi_bytes, "count": b.count, "bytes": b.bytes}
        for b in buckets
    ]


def space_document(s: SpaceAnalysis) -> dict[str, Any]:
    c = s.counts
    t = s.timeline
    idx = t.sample_indices(s.peak_index)
    doc: dict[str, Any] = {
        "pid": s.pid,
        "device": s.device,
        "device_name": s.device_name,
        "process_name": s.process_name,
        "model": s.model,
        "capacity_bytes": s.capacity_bytes,
        "base_address": s.base_address,
        "arena_end_address": s.arena_end,
        "span_mode": s.span_mode,
        "counts": {
            "allocations": c.allocations,
            "frees": c.frees,
            "unmatched_frees": c.unmatched_frees,
            "overlaps": c.overlaps,
            "zero_size_allocs": c.zero_size_allocs,
            "failed_allocations": c.failed_allocations,
            "other_kind_events": c.other_kind_events,
        },
        "alloc_failure_rate": s.alloc_failure_rate,
        "peak": _state(s.peak),
        "max": {
            "global_frag": s.max_global_frag,
            "local_frag": s.max_local_frag,
            "free_blocks": s.max_free_blocks,
            "live_bytes": s.max_live_bytes,
        },
        "final": _state(s.final),
        "internal_frag": s.internal_frag,
        "growth_per_s": s.growth_per_s,
        "health": s.health.label,
        "out_of_order_frees": s.out_of_order_frees,
        "hole_creating_frees": s.hole_creating_frees,
        "caching_allocator_suspected": s.caching_allocator_suspected,
        "advice": advise(s),
        "hotspots": [
            {
                "site": h.site,
                "size_class": size_class_label(h.size_lo_bytes.bit_length() - 1),
                "size_lo_bytes": h.size_lo_bytes,
                "out_of_order_frees": h.out_of_order_frees,
                "hole_creating_frees": h.hole_creating_frees,
                "hole_bytes": h.hole_bytes,
                "pinned_by": list(h.pinned_by),
            }
            for h in s.hotspots
        ],
        "size_histogram": _buckets(s.size_histogram),
        "free_block_histogram": _buckets(s.free_block_histogram),
        "timeline": {
            "time_ns": t.time_ns[idx].tolist(),
            "global_frag": t.global_frag[idx].tolist(),
            "local_frag": t.local_frag[idx].tolist(),
            "free_blocks": t.free_blocks[idx].tolist(),
            "largest_free_bytes": t.largest_free_bytes[idx].tolist(),
            "live_bytes": t.live_bytes[idx].tolist(),
        },
    }
    # Model-specific keys (e.g. the snapshot's reserved bytes) never replace the SPEC keys.
    doc.update({k: v for k, v in s.extras.items() if k not in doc})
    return doc


def document(analysis: Analysis) -> dict[str, Any]:
    """The whole analysis as JSON-ready data (keys stable; new keys may be added)."""
    return {
        "schema": SCHEMA,
        "trace": {
            "path": analysis.trace_path,
            "nsys_version": analysis.nsys_version,
            "skipped_rows": analysis.skipped_rows,
            "vmm_calls": analysis.vmm_calls,
            "unattributed_failed_allocations": analysis.unattributed_failures,
            "unassigned_other_kind_events": analysis.unassigned_other_kind_events,
            "warnings": analysis.warnings,
        },
        "model": {"name": analysis.model, "granularity_bytes": analysis.granularity_bytes},
        "spaces": [space_document(s) for s in analysis.spaces],
    }


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def render(analysis: Analysis) -> str:
    return dumps(document(analysis))
