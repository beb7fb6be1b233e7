"""The emission rules on their own: UTF-8 and stop-string holdback, finish reasons.

TextStream against a direct reference (the whole text, cut before its first stop string) for any
split of the bytes; TokenOutput with the real SmolLM2 tokenizer (its pieces split multi-byte
characters across tokens, and it has a real end-of-generation token).
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from localspec.llama.llama_model import Model
from localspec.runtime.text_stream import TextStream, TokenOutput

TEXT = st.text(alphabet=st.sampled_from(list("ab ,.\n") + ["é", "€", "😀", "中"]), max_size=40)


@st.composite
def chunked(draw):
    """A text and a split of its UTF-8 bytes into chunks (cut anywhere, inside characters too)."""
    text = draw(TEXT)
    data = text.encode("utf-8")
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=12))) if len(data) > 1 else []
    bounds = [0] + cuts + [len(data)]
    return text, [data[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=300, deadline=None)
@given(chunked(), st.one_of(st.none(), st.text(alphabet=st.sampled_from(list("ab ,") + ["é", "😀"]),
                                                min_size=1, max_size=4)))
def test_text_stream_releases_the_text_before_the_first_stop_string(sample, stop):
    text, chunks = sample
    stream = TextStream([stop] if stop else [])
    released = ""
    for chunk in chunks:
        out = stream.push(chunk)
        released += out
        expected_so_far = text if not stop or stop not in text else text[:text.find(stop)]
        assert expected_so_far.startswith(released)       # never ahead of the reference
        if stop:
            assert stop not in released                   # a stop string is never shown
        if stream.stopped:
            break
    released += stream.flush()
    expected = text if not stop or stop not in text else text[:text.find(stop)]
    assert released == expected == stream.text
    assert stream.stopped == bool(stop and stop in text)


def test_text_stream_holds_back_one_character_less_than_the_longest_stop_string():
    stream = TextStream(["END", "X"])
    assert stream.push(b"abc E") == "abc"          # the last 2 characters could begin "END"
    assert stream.push(b"x") == " "
    assert stream.push(b"N") == "E"
    assert stream.push(b"D!") == "xN"
    assert stream.flush() == "D!" and not stream.stopped
    euro = "€".encode()
    stream = TextStream([])
    assert stream.push(euro[:2]) == "" and stream.push(euro[2:]) == "€"   # a character is whole or held


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_token_output_finish_reasons_with_a_real_tokenizer(smollm2):
    model = Model(smollm2)
    try:
        tokens = model.tokenize("Grüße 😀, done. More", add_special=False)
        assert any(not _is_utf8(model.piece(t)) for t in tokens)   # some piece splits a character
        committed = [(t, i % 2 == 1) for i, t in enumerate(tokens)]

        out = TokenOutput(model, [], max_tokens=1000)
        events = list(out.emit(committed)) + list(out.close())
        assert out.finish is None and out.tokens == tokens
        assert "".join(e.text for e in events) == out.text == "Grüße 😀, done. More"
        assert [e.from_draft for e in events[:len(tokens)]] == [c[1] for c in committed]

        out = TokenOutput(model, [", done"], max_tokens=1000)
        events = list(out.emit(committed))
        assert out.finish == "stop" and out.text == "Grüße 😀"

        out = TokenOutput(model, [], max_tokens=3)
        assert len(list(out.emit(committed))) == 3 and out.finish == "length" and out.remaining == 0

        out = TokenOutput(model, [], max_tokens=1000)
        events = list(out.emit(committed[:2] + [(model.eos, False)] + committed[2:]))
        assert model.is_eog(model.eos) and out.finish == "stop" and out.tokens == tokens[:2]
        assert len(events) == 2                      # the end-of-generation token is not emitted
    finally:
        model.close()


def test_text_is_the_incremental_decoders_for_any_cut_of_the_bytes():
    """Whole characters skip the incremental decoder (push's fast path): for random cuts of UTF-8
    text with multi-byte characters and invalid bytes, the text is the incremental decoder's."""
    import codecs
    import random

    rng = random.Random(0)
    samples = ["héllo wörld ✓ 日本語 🎉🎉 " * 3, "plain ascii text"]
    for _ in range(2000):
        raw = rng.choice(samples).encode() + bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
        cuts = sorted(rng.sample(range(1, len(raw)), rng.randrange(1, 12)))
        parts = [raw[a:b] for a, b in zip([0] + cuts, cuts + [len(raw)])]
        stream = TextStream([])
        text = "".join(stream.push(p) for p in parts) + stream.flush()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        assert text == "".join(decoder.decode(p) for p in parts) + decoder.decode(b"", final=True), parts
