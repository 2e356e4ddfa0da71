"""The cleaner's record scanner and raw rebuild agree with the full codec (property tests).

`record_spans` (offsets, keys and null values read without decoding records) must give exactly what
`RecordBatch.records()` decodes, for every varint width, null and large keys and values, headers,
gzip and any timestamps; `retain_spans` (kept records' bytes copied) must equal `retain_records`
(kept records re-encoded) byte for byte, and `decode_record` must decode a single span.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.records import (
    RecordBatch,
    decode_record,
    encode_records,
    read_header,
    record_spans,
    records_payload,
    retain_records,
    retain_spans,
)
from tests.compaction.logs import gzip_batch
from tests.eventlog.strategies import record_lists


@settings(max_examples=150, deadline=None)
@given(records=record_lists(max_size=10), keep=st.lists(st.booleans(), min_size=10, max_size=10))
def test_spans_match_the_codec_and_rebuilds_match(records, keep):
    raw = encode_records(records)
    header = read_header(raw)
    decoded = list(RecordBatch.parse(raw).records())
    payload = records_payload(header, raw)
    spans = record_spans(header, payload)
    assert [(s.offset, s.key, s.null_value) for s in spans] == [(r.offset, r.key, r.value is None) for r in decoded]
    assert [decode_record(header, payload, s) for s in spans] == decoded
    kept = [s for s, k in zip(spans, keep) if k]
    if kept:
        assert retain_spans(header, payload, kept) == retain_records(
            header, [r for r, k in zip(decoded, keep) if k])


@settings(max_examples=50, deadline=None)
@given(entries=st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=40)),
                                  st.one_of(st.none(), st.binary(max_size=300))), min_size=1, max_size=8),
       keep=st.lists(st.booleans(), min_size=8, max_size=8))
def test_gzip_batches(entries, keep):
    raw = gzip_batch(entries, 1_000)
    header = read_header(raw)
    payload = records_payload(header, raw)
    spans = record_spans(header, payload)
    assert [(s.key, s.null_value) for s in spans] == [(k, v is None) for k, v in entries]
    kept = [s for s, k in zip(spans, keep) if k]
    if kept:
        out = retain_spans(header, payload, kept)
        assert read_header(out).compression == header.compression   # kafka-python skips gzip when it does not shrink
        assert [(r.key, r.value) for r in RecordBatch.parse(out).records()] == [
            e for e, k in zip(entries, keep) if k]
