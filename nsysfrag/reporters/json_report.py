"""The JSON document (schema ``nsysfrag/1``)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from nsysfrag.analysis import Analysis, Bucket, SpaceAnalysis, State
from nsysfrag.analysis.advice import advise
from nsysfrag.analysis.metrics import HealthBasis, size_class_label
from nsysfrag.analysis.results import FRAGMENTATION, Failure
from nsysfrag.schemas import ANALYSIS as SCHEMA

if TYPE_CHECKING:  # a snapshot's figures; an nsys trace's document loads no snapshot model
    from nsysfrag.analysis.results import PeakSites
    from nsysfrag.models.section import SnapshotSection

# The sites each per-site list of a document names (the rest are one "other sites" total), so
# that a document stays small whatever the input; compare reads them back.
SITES_LISTED = 50


def state_document(s: State) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "time_ns": s.time_ns,
        "global_frag": s.global_frag,
        "local_frag": s.local_frag,
        "free_blocks": s.free_blocks,
        "largest_free_bytes": s.largest_free_bytes,
        "free_bytes": s.free_bytes,
        "live_bytes": s.live_bytes,
    }
    if s.pool is not None:  # a caching allocator's own figures, in the PoolState's order
        doc.update(dataclasses.asdict(s.pool))
    return doc


def health_basis_document(b: HealthBasis | None) -> dict[str, Any] | None:
    return None if b is None else {"metric": b.metric, "value": b.value, "time_ns": b.time_ns}


def failure_document(f: Failure) -> dict[str, Any]:
    """One failed allocation: its time and request, the state then, and the verdict."""
    state = state_document(f.state)
    doc: dict[str, Any] = {"time_ns": state.pop("time_ns"), "requested_bytes": f.requested_bytes}
    doc.update(state)
    doc["verdict"] = f.verdict
    if f.recorded_device_free_bytes is not None:
        doc["recorded_device_free_bytes"] = f.recorded_device_free_bytes
    if f.site is not None:
        doc["site"] = f.site
        doc["stack"] = list(f.stack)
    if f.verdict == FRAGMENTATION:
        doc["stranded_sites"] = [dataclasses.asdict(x) for x in f.stranded_sites]
    return doc


def _buckets(buckets: list[Bucket]) -> list[dict[str, int]]:
    return [
        {"lo_bytes": b.lo_bytes, "hi_bytes": b.hi_bytes, "count": b.count, "bytes": b.bytes}
        for b in buckets
    ]


def peak_sites_document(x: PeakSites, listed: int | None = SITES_LISTED) -> dict[str, Any]:
    """Each site's live and stranded bytes at the memory peak: the first ``listed`` sites of
    each (every site when None), then what the others hold. The stranded bytes of the sites
    overlap (a segment counts for each site with a block in it); ``other_bytes`` there is the
    stranded memory no listed site pins."""
    live = x.live if listed is None else x.live[:listed]
    stranded = x.stranded if listed is None else x.stranded[:listed]
    names = {s.site for s in stranded}
    return {
        "live": {
            "total_bytes": sum(s.bytes for s in x.live),
            "sites": [{"site": s.site, "bytes": s.bytes} for s in live],
            "other_sites": len(x.live) - len(live),
            "other_bytes": sum(s.bytes for s in x.live[len(live) :]),
        },
        "stranded": {
            "total_bytes": x.stranded_bytes,
            "sites": [{"site": s.site, "bytes": s.bytes} for s in stranded],
            "other_sites": len(x.stranded) - len(stranded),
            "other_bytes": x.unpinned_by(names) if len(stranded) < len(x.stranded) else 0,
        },
    }


def space_document(s: SpaceAnalysis, sites_listed: int | None = SITES_LISTED) -> dict[str, Any]:
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
        # Where C came from (--capacity, device, oom, oom_retries, reserved_peak: an assumption).
        "capacity_source": s.capacity_source,
        "capacity_basis": s.capacity_basis,
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
        "peak": state_document(s.peak),
        **({} if s.memory_peak is None else {"memory_peak": state_document(s.memory_peak)}),
        **(
            {}
            if s.memory_peak_sites is None
            else {"memory_peak_sites": peak_sites_document(s.memory_peak_sites, sites_listed)}
        ),
        "max": {
            "global_frag": s.max_global_frag,
            "local_frag": s.max_local_frag,
            "free_blocks": s.max_free_blocks,
            "live_bytes": s.max_live_bytes,
        },
        "final": state_document(s.final),
        "internal_frag": s.internal_frag,
        "growth_per_s": s.growth_per_s,
        "health": s.health.label,
        "health_basis": health_basis_document(s.health_basis),
        # Maxima above a threshold that the health does not count (fewer than 5 % free then).
        "unrated_maxima": [dataclasses.asdict(u) for u in s.unrated],
        "ooms": [failure_document(f) for f in s.ooms],
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
    if s.snapshot is not None:
        # The snapshot's own figures follow the contract's keys and never replace one.
        doc.update({k: v for k, v in snapshot_document(s.snapshot).items() if k not in doc})
    return doc


def snapshot_document(x: SnapshotSection) -> dict[str, Any]:
    """The figures only a PyTorch snapshot has."""
    return {
        "snapshot_layout": x.facts.layout,
        "allocator_conf": x.facts.allocator_conf,
        "expandable_segments": x.facts.expandable_segments,
        "time_origin_unix_us": x.facts.time_origin_unix_us,
        "reserved_bytes_peak": x.reserved_bytes_peak,
        "allocated_bytes_peak": x.allocated_bytes_peak,
        "active_bytes_peak": x.active_bytes_peak,
        "requested_bytes_peak": x.requested_bytes_peak,
        "reserved_bytes_at_frag_peak": x.reserved_bytes_at_frag_peak,
        "releasable_bytes_at_frag_peak": x.releasable_bytes_at_frag_peak,
        "reserved_bytes_final": x.reserved_bytes_final,
        "allocated_bytes_final": x.allocated_bytes_final,
        "active_bytes_final": x.active_bytes_final,
        "requested_bytes_final": x.requested_bytes_final,
        # Both dataclasses hold their keys in the document's order.
        "window": dataclasses.asdict(x.window),
        "oom_events": [dataclasses.asdict(o) for o in x.oom_events],
    }


def model_document(analysis: Analysis) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": analysis.model, "granularity_bytes": analysis.granularity_bytes}
    if analysis.page_bytes is not None:
        doc["page_bytes"] = analysis.page_bytes
    return doc


def document(analysis: Analysis, sites_listed: int | None = SITES_LISTED) -> dict[str, Any]:
    """The whole analysis as JSON-ready data (keys stable; new keys may be added); each
    per-site list names its first ``sites_listed`` sites (None: all)."""
    counts = analysis.input_counts
    words = analysis.source.words
    return {
        "schema": SCHEMA,
        "trace": {
            "path": analysis.source.path,
            # Which input this is, and the words its reports use, so that a report made from
            # the document alone (compare) speaks of it as the analysis did.
            "input": analysis.source.kind,
            "words": {
                "space_title": words.space_title,
                "input_noun": words.input_noun,
                "site_label": words.site_label,
                "untimed": words.untimed,
            },
            "nsys_version": analysis.source.version,
            "skipped_rows": counts.skipped_rows,
            "vmm_calls": counts.vmm_calls,
            "unattributed_failed_allocations": counts.unattributed_failures,
            "unassigned_other_kind_events": counts.unassigned_other_kind_events,
            # The origin of every time the human reports show (seconds since it), and whether
            # times are timestamps at all (False: a snapshot without times, entry numbers).
            "first_event_ns": analysis.source.first_event_ns,
            "timestamps": all(s.timestamps for s in analysis.spaces),
            "warnings": analysis.warnings,
        },
        "model": model_document(analysis),
        "spaces": [space_document(s, sites_listed) for s in analysis.spaces],
    }


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def render(analysis: Analysis) -> str:
    return dumps(document(analysis))
