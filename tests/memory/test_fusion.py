"""Search decisions as pure functions: text share, weighted RRF, abstention, decay, order."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import date

import pytest

from memory.candidates import Candidate, merge_pools
from memory.fusion import FusionParams, daily_log_date, decay, fuse, fused_score, passes, rrf_score, text_strength
from memory.speakers import named_speakers, spoken_by, turn_speaker
from memory.terms import distinct_words, is_cjk_query, query_terms, text_share
from memory.topic import off_topic, spells_name, unheld_topic_words

P = FusionParams(vector_weight=0.6, text_weight=0.4, min_score=0.4, min_text_score=0.6)
TODAY = date(2026, 11, 30)


def cand(cid: str, cosine: float = 0.0, share: float = 0.0, path: str = "MEMORY.md", **kw: int | None) -> Candidate:
    return Candidate(cid, path, 1, 2, "", f"text of {cid}", cosine, share, kw.get("vr"), kw.get("tr"))


@pytest.mark.parametrize(
    ("query", "content", "share"),
    [
        ("Who is my dentist?", "My dentist is Dr. Wong.", 1.0),
        ("dentist appointments", "The dentist appointment is on Tuesday", 1.0),
        ("What is my cat's name?", "The dog is called Rex; my name is Ann.", 0.5),
        ("What is my cat's name?", "nothing relevant", 0.0),
        ("歯医者の予約はいつ？", "東京の歯医者の予約は火曜日です", 1.0),
        ("歯医者の名前", "東京の歯医者の予約は火曜日です", 0.5),
        ("the and of", "the and of", 0.0),  # no content terms at all
    ],
)
def test_text_share(query: str, content: str, share: float) -> None:
    assert text_share(query_terms(query), content) == pytest.approx(share)


def test_text_share_does_not_depend_on_other_documents() -> None:
    terms = query_terms("green tea morning")
    assert text_share(terms, "I drink green tea every morning") == 1.0


def test_rrf_is_scaled_to_one_and_weighted() -> None:
    assert rrf_score(cand("a", vr=1, tr=1), P) == pytest.approx(1.0)
    only_vec = rrf_score(cand("a", vr=1), P)
    only_text = rrf_score(cand("a", tr=1), P)
    assert only_vec == pytest.approx(0.6) and only_text == pytest.approx(0.4)
    assert rrf_score(cand("a", vr=2), P) < only_vec
    assert 0.0 <= rrf_score(cand("a", vr=100, tr=100), P) <= 1.0


@pytest.mark.parametrize(
    ("cosine", "share", "min_score", "min_text", "ok"),
    [
        (0.5, 0.0, 0.4, 0.6, True),
        (0.3, 0.7, 0.4, 0.6, True),
        (0.3, 0.5, 0.4, 0.6, False),
        (0.9, 0.0, 0.0, 0.6, False),  # vector threshold off: only the text test admits
        (0.0, 0.9, 0.0, 0.6, True),
        (0.0, 0.0, 0.0, 0.0, True),  # both off: no abstention
    ],
)
def test_abstention_is_absolute(cosine: float, share: float, min_score: float, min_text: float, ok: bool) -> None:
    params = FusionParams(0.5, 0.5, min_score, min_text)
    assert passes(cand("a", cosine, share), params) is ok


def test_merge_pools_keeps_both_ranks() -> None:
    merged = {
        c.chunk_id: c for c in merge_pools([(cand("a"), 0.9), (cand("b"), 0.8)], [(cand("b"), 3.0), (cand("c"), 2.0)])
    }
    assert (merged["a"].vector_rank, merged["a"].text_rank) == (1, None)
    assert (merged["b"].vector_rank, merged["b"].text_rank) == (2, 1)
    assert (merged["c"].vector_rank, merged["c"].text_rank) == (None, 2)


def test_tied_pool_scores_share_a_rank_whatever_order_the_database_used() -> None:
    one = merge_pools([(cand("b"), 0.5), (cand("a"), 0.5), (cand("c"), 0.4)], [])
    two = merge_pools([(cand("a"), 0.5), (cand("c"), 0.4), (cand("b"), 0.5)], [])
    ranks = {c.chunk_id: c.vector_rank for c in one}
    assert ranks == {c.chunk_id: c.vector_rank for c in two} == {"a": 1, "b": 1, "c": 3}


def test_order_is_stable_as_k_grows_and_ties_go_by_chunk_id() -> None:
    pool = [cand(f"c{i:02d}", 0.5 + (i % 3) / 10, vr=1 + i % 4) for i in range(20)]
    full = fuse(pool, P, today=TODAY, k=20)
    for k in range(1, 21):
        assert fuse(pool, P, today=TODAY, k=k) == full[:k]
    tied = [h for h in full if h.score == full[0].score]
    assert [h.chunk_id for h in tied] == sorted(h.chunk_id for h in tied)


def test_nothing_clears_the_threshold_gives_an_empty_list() -> None:
    pool = [cand("a", 0.1, 0.2, vr=1, tr=1), cand("b", 0.2, 0.0, vr=2)]
    assert fuse(pool, P, today=TODAY, k=5) == []


def test_hit_carries_citation_and_scores() -> None:
    [hit] = fuse([cand("a", 0.7, 1.0, path="memory/2026-11-29.md", vr=1, tr=1)], P, today=TODAY, k=3)
    assert hit.citation == "memory/2026-11-29.md#L1-L2"
    assert (hit.score, hit.vector_score, hit.text_score) == (1.0, 0.7, 1.0)
    assert set(hit.as_dict()) >= {"path", "start_line", "end_line", "heading", "score", "snippet", "citation"}


def test_recency_decay_applies_to_daily_logs_only_after_abstention() -> None:
    params = FusionParams(0.6, 0.4, 0.4, 0.6, recency_half_life_days=10)
    old = cand("old", 0.8, 0.0, path="memory/2026-11-10.md", vr=1)
    fresh = cand("new", 0.8, 0.0, path="memory/2026-11-30.md", vr=2)
    core = cand("core", 0.8, 0.0, path="MEMORY.md", vr=3)
    hits = {h.chunk_id: h for h in fuse([old, fresh, core], params, today=TODAY, k=5)}
    assert set(hits) == {"old", "new", "core"}  # decay never turns a passing hit into an abstention
    assert hits["old"].score == pytest.approx(rrf_score(old, params) / 4)
    assert hits["new"].score == pytest.approx(rrf_score(fresh, params))
    assert hits["core"].score == pytest.approx(rrf_score(core, params))


@pytest.mark.parametrize(
    ("path", "day"),
    [
        ("memory/2026-11-29.md", date(2026, 11, 29)),
        ("memory/logs/2026-01-02.md", date(2026, 1, 2)),
        ("MEMORY.md", None),
        ("memory/notes.md", None),
        ("memory/2026-13-40.md", None),
    ],
)
def test_daily_log_date(path: str, day: date | None) -> None:
    assert daily_log_date(path) == day


def test_decay_without_half_life_is_identity() -> None:
    assert decay(0.5, "memory/2000-01-01.md", TODAY, None) == 0.5


# --- score fusion ---------------------------------------------------------------------------------

S = FusionParams(vector_weight=0.4, text_weight=0.6, min_score=0.3, min_text_score=0.0, method="score",
                 text_saturation=10.0)  # fmt: skip


def scored(cid: str, cosine: float, bm25: float, share: float = 1.0, **kw: int | None) -> Candidate:
    return replace(cand(cid, cosine, share, **kw), bm25=bm25)


@pytest.mark.parametrize(
    ("bm25", "share", "strength"),
    [
        (0.0, 1.0, 0.0),  # the full-text index does not match it: no strength, whatever the share
        (-1.0, 1.0, 0.0),
        (10.0, 0.0, 0.25),  # BM25 at the saturation point is half a BM25 match
        (10.0, 1.0, 0.75),
        (20.0, 1 / 3, (1 / 243 + 8 / 9) / 2),  # the share to the fifth power, BM25 through the Hill curve
        (1e9, 1.0, 1.0),
    ],
)
def test_text_strength_is_absolute(bm25: float, share: float, strength: float) -> None:
    assert text_strength(bm25, share, 10.0) == pytest.approx(strength, abs=1e-6)


def test_a_weak_word_match_barely_counts() -> None:
    """One word of three, and a common one (a name every turn of a chat holds): a few hundredths at
    most, so it cannot reorder chunks the vector side finds equally close."""
    assert text_strength(6.0, 1 / 3, 40.0) < 0.03
    assert text_strength(6.0, 1 / 3, 40.0) < text_strength(6.0, 1.0, 40.0) / 20
    assert text_strength(40.0, 1.0, 40.0) == pytest.approx(0.75)
    # two of three, both common ("Pavel" and "job" in "Pavel: My old job was stressful too." asked
    # "What is Pavel's current job?"): under a fifth of a full match
    assert text_strength(7.5, 2 / 3, 40.0) < text_strength(7.5, 1.0, 40.0) / 5


def test_a_single_weak_result_does_not_score_one() -> None:
    weak = scored("a", cosine=0.2, bm25=1.5, share=0.5, vr=1, tr=1)  # best of both pools, and still weak
    hits = fuse([weak], replace(S, min_score=0.0), today=TODAY, k=5)
    expected = 0.4 * 0.2 + 0.6 * (0.5**5 + 1.5**3 / (1.5**3 + 10.0**3)) / 2
    assert len(hits) == 1 and hits[0].score == pytest.approx(expected, abs=1e-6)
    assert hits[0].score < 0.25
    assert fuse([weak], S, today=TODAY, k=5) == []  # and abstention drops it


def test_score_fusion_is_the_same_for_a_chunk_whatever_else_is_found() -> None:
    target = scored("t", cosine=0.55, bm25=12.0, vr=3, tr=2)
    alone = fuse([target], S, today=TODAY, k=5)[0].score
    crowd = [target, scored("x", 0.9, 40.0, vr=1, tr=1), scored("y", 0.7, 0.0, vr=2)]
    assert fuse(crowd, S, today=TODAY, k=5)[1].score == alone  # ranks do not enter the score


def test_a_strong_word_match_beats_a_vague_vector_neighbour() -> None:
    exact = scored("exact", cosine=0.30, bm25=25.0, vr=40, tr=1)
    vague = scored("vague", cosine=0.55, bm25=0.0, vr=1)
    assert [h.chunk_id for h in fuse([vague, exact], replace(S, min_score=0.0), today=TODAY, k=2)] == ["exact", "vague"]


def test_a_language_the_embedder_does_not_know_is_decided_on_the_text_side() -> None:
    unrelated = scored("u", cosine=0.65, bm25=0.0, vr=1)  # what MiniLM gives any Japanese pair
    matched = scored("m", cosine=0.40, bm25=8.0, share=0.5, vr=2, tr=1)
    blind = replace(S, use_vector=False)
    assert [h.chunk_id for h in fuse([unrelated, matched], blind, today=TODAY, k=5)] == ["m"]
    assert fused_score(matched, blind) == pytest.approx(text_strength(8.0, 0.5, 10.0))
    assert {h.chunk_id for h in fuse([unrelated, matched], replace(S, min_score=0.0), today=TODAY, k=5)} == {"u", "m"}


@pytest.mark.parametrize(
    ("query", "cjk"),
    [("夫の誕生日はいつ？", True), ("旦那さんのバースデー", True), ("When is my husband's birthday?", False),
     ("Tokyo の天気", True), ("Tokyo weather 東", False), ("1234 ?", False), ("", False)],
)  # fmt: skip
def test_is_cjk_query(query: str, cjk: bool) -> None:
    assert is_cjk_query(query) is cjk


def test_merge_keeps_the_bm25_of_a_chunk_found_by_both_sides() -> None:
    v = cand("a", 0.5)
    t = replace(cand("a", 0.5), bm25=7.0)
    merged = merge_pools([(v, 0.5)], [(t, 7.0)])
    assert len(merged) == 1 and merged[0].bm25 == 7.0 and merged[0].vector_rank == 1 and merged[0].text_rank == 1


def turn(cid: str, line: int, cosine: float, path: str = "memory/chat/s1.md") -> Candidate:
    """A one-paragraph chunk at ``line`` (its blank line after it included)."""
    return Candidate(cid, path, line, line + 1, "", f"text of {cid}", cosine, 0.0, 1, None)


def test_a_turn_followed_by_a_strong_match_ranks_above_an_equal_lone_one() -> None:
    """The turn before a strong match gains a share of its score (the match's indexed context is
    that turn); the turn after it, another file's turn, and a lone turn do not."""
    p = FusionParams(1.0, 0.0, 0.0, 0.0, method="score", neighbour_weight=0.2)
    pool = [turn("question", 3, 0.5), turn("answer", 5, 0.8), turn("reply", 7, 0.5), turn("lone", 21, 0.5),
            turn("elsewhere", 1, 0.5, path="memory/chat/s2.md")]  # fmt: skip
    hits = fuse(pool, p, today=TODAY, k=5)
    assert [h.chunk_id for h in hits] == ["answer", "question", "elsewhere", "lone", "reply"]
    assert hits[1].score == pytest.approx(0.5 + 0.2 * 0.8)
    capped = fuse([turn("a", 5, 0.9), turn("b", 7, 0.95)], replace(p, neighbour_weight=0.5), today=TODAY, k=1)
    assert capped[0].score == 1.0
    # without the weight the four 0.5 turns tie and go by chunk id
    plain = fuse(pool, replace(p, neighbour_weight=0.0), today=TODAY, k=5)
    assert [h.chunk_id for h in plain] == ["answer", "elsewhere", "lone", "question", "reply"]


def test_neighbours_never_let_a_chunk_past_abstention() -> None:
    """Abstention is decided on a chunk's own score: a weak turn next to a strong one stays out."""
    p = FusionParams(1.0, 0.0, 0.45, 0.0, method="score", neighbour_weight=0.5)
    hits = fuse([turn("weak", 3, 0.3), turn("strong", 5, 0.9)], p, today=TODAY, k=5)
    assert [h.chunk_id for h in hits] == ["strong"]


def note(cid: str, cosine: float, text: str, line: int) -> Candidate:
    return Candidate(cid, "MEMORY.md", line, line, "", text, cosine, 0.0, 1, None)


MMR_POOL = [
    note("dentist-1", 0.90, "Dentist appointment with Dr. Wong on Tuesday at nine", 1),
    note("dentist-2", 0.89, "Dentist appointment with Dr. Wong moved to Tuesday at nine", 3),
    note("dentist-3", 0.88, "Reminder: dentist appointment, Dr. Wong, Tuesday nine", 5),
    note("insurance", 0.80, "The dental insurance card is in the blue folder", 7),
    note("parking", 0.70, "Parking near the clinic is on Elm Street", 9),
]


def test_mmr_pushes_repeats_of_a_shown_result_down() -> None:
    """search.mmr: with a lambda the near-duplicates of the best hit give way to other facts; the
    best hit stays first, each hit keeps its own score, and lambda 1 or off is the fused order."""
    p = FusionParams(1.0, 0.0, 0.0, 0.0, method="score")
    fused = [h.chunk_id for h in fuse(MMR_POOL, p, today=TODAY, k=5)]
    assert fused == ["dentist-1", "dentist-2", "dentist-3", "insurance", "parking"]
    assert [h.chunk_id for h in fuse(MMR_POOL, replace(p, mmr=1.0), today=TODAY, k=5)] == fused
    diverse = fuse(MMR_POOL, replace(p, mmr=0.5), today=TODAY, k=5)
    assert [h.chunk_id for h in diverse][:3] == ["dentist-1", "insurance", "parking"]
    assert sorted(h.chunk_id for h in diverse) == sorted(fused)
    assert {h.chunk_id: h.score for h in diverse}["insurance"] == pytest.approx(0.80)
    # the first k never change as k grows (the re-ordered depth does not depend on k)
    for k in range(1, 6):
        assert [h.chunk_id for h in fuse(MMR_POOL, replace(p, mmr=0.5), today=TODAY, k=k)] == [
            h.chunk_id for h in diverse
        ][:k]


def test_mmr_similarity_is_of_the_chunks_own_words() -> None:
    """Japanese chunks are compared on their CJK words; stop words and the indexed context do not
    make two chunks alike."""
    from memory.mmr import diversify, jaccard
    from memory.terms import words_of

    assert jaccard(words_of("The dentist is on Tuesday"), words_of("Is it the dentist on Tuesday?")) == 1.0
    assert jaccard(words_of("the and of it"), words_of("the and of it")) == 0.0
    assert jaccard(words_of("歯医者の予約は火曜日"), words_of("歯医者の予約は火曜日です")) == 1.0
    ranked = [(0.9, words_of("歯医者の予約は火曜日"), "a"), (0.89, words_of("歯医者の予約は火曜日です"), "b"),
              (0.8, words_of("保険証は青いフォルダ"), "c")]  # fmt: skip
    assert diversify(ranked, 0.5) == ["a", "c", "b"]
    assert diversify(ranked, 0.5, depth=1) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("text", "speaker"),
    [
        ("[D3:1] Ravi: Today I baked a plum cake", "Ravi"),
        ("Ravi: hi", "Ravi"),
        ("- **Ann Lee**: see you at nine", "Ann Lee"),
        ("[10:42] Pavel B.: my old job", "Pavel B."),
        ("TODO: buy milk", ""),  # all capitals: a label, not a person
        ("note: the dentist moved", ""),
        ("Plan for today: run", ""),  # not a name: lower-case words
        ("My dentist is Dr. Wong", ""),
        ("# Ravi and Ines, 8 May 2023", ""),
        ("# Ravi and Ines, 8 May 2023\n\n[D2:1] Ines: I am at the bakery", "Ines"),  # a session's first turn
    ],
)
def test_turn_speaker(text: str, speaker: str) -> None:
    assert turn_speaker(text) == speaker


def test_a_name_counts_only_in_the_chunks_own_lines() -> None:
    """In a chat every turn's indexed content names both people (heading, the turn before), so
    the query's name of a speaker counts for a chunk only when its own lines hold it."""
    terms = query_terms("What cake did Ravi bake?")
    own = {"ravi": "[D1:3] Ravi: Today I baked a plum cake with my dad.",
           "ines": "[D1:4] Ines: Baking a cake for others is the best!"}  # fmt: skip
    names = named_speakers(terms, own.values())
    assert names == frozenset({"ravi"})
    assert named_speakers(query_terms("What cake did Maria bake?"), own.values()) == frozenset()

    def content(who: str) -> str:
        return f"Ravi and Ines, 8 May 2023\n\n{own['ravi' if who == 'ines' else 'ines']}\n\n{own[who]}"

    assert text_share(terms, content("ines")) == 1.0  # without names: the heading's "Ravi"
    assert text_share(terms, content("ines"), own["ines"], names) == pytest.approx(2 / 3)
    assert text_share(terms, content("ravi"), own["ravi"], names) == 1.0
    # a turn that names the person in its own text keeps the name
    assert text_share(terms, content("ines"), "Ines: Ravi, your cake! Who baked it?", names) == 1.0
    # the heading of a session's first chunk is not its own words
    first = f"# Ravi and Ines, 8 May 2023\n\n{own['ines']}"
    assert text_share(terms, first, first, names) == pytest.approx(2 / 3)
    assert spoken_by(names, own["ravi"]) and not spoken_by(names, own["ines"])
    assert not spoken_by(frozenset(), own["ravi"])


def spoken(cid: str, line: int, cosine: float, named: bool) -> Candidate:
    return replace(turn(cid, line, cosine), named_speaker=named)


def test_the_named_speakers_turns_rank_higher_but_abstention_is_unchanged() -> None:
    p = FusionParams(1.0, 0.0, 0.0, 0.0, method="score", speaker_weight=0.2)
    pool = [spoken("other", 3, 0.55, False), spoken("named", 21, 0.5, True), spoken("far", 41, 0.3, False)]
    hits = fuse(pool, p, today=TODAY, k=3)
    assert [h.chunk_id for h in hits] == ["named", "other", "far"]
    assert hits[0].score == pytest.approx(0.6)
    plain = fuse(pool, replace(p, speaker_weight=0.0), today=TODAY, k=3)
    assert [h.chunk_id for h in plain] == ["other", "named", "far"]
    # the lift is capped at 1 and never lets a turn past min_score (decided on its own score)
    assert fuse([spoken("a", 1, 0.95, True)], p, today=TODAY, k=1)[0].score == 1.0
    quiet = fuse(pool, replace(p, min_score=0.52), today=TODAY, k=3)
    assert [h.chunk_id for h in quiet] == ["other"]


def test_merge_keeps_the_named_speaker_flag() -> None:
    v = spoken("a", 1, 0.5, True)
    t = replace(spoken("a", 1, 0.5, False), bm25=3.0)
    assert merge_pools([(v, 0.5)], [(t, 3.0)])[0].named_speaker
    assert merge_pools([(v, 0.5)], [])[0].named_speaker


def said(cid: str, text: str, cosine: float, bm25: float = 2.0) -> Candidate:
    return Candidate(cid, "memory/chat/s1.md", 1, 1, "", text, cosine, 0.3, 1, 1, bm25)


def test_a_query_with_a_topic_word_no_candidate_holds_is_off_topic() -> None:
    """ "What is Ravi's blood type?" over a chat of Ravi's: "blood" is in no candidate, nothing
    embeds close and nothing matches the rest well, so it gets nothing. Every topic word held, a
    close cosine or a strong best score keeps it; names, numbers and months are no topic."""
    chat = [said("a", "[D1:1] Ravi: I went to the gym today", 0.45),
            said("b", "[D1:2] Ines: Nice, what type of workout?", 0.50, bm25=0.0)]  # fmt: skip
    query = "What is Ravi's blood type?"
    assert unheld_topic_words(query, chat) == ["blood"]  # "type" is in Ines's turn, "Ravi" is a speaker
    assert off_topic(query, chat, 0.55, best=0.1, min_best=0.2)
    assert not off_topic(query, chat, 0.55, best=0.2, min_best=0.2)  # the rest of the query matches well
    assert not off_topic(query, chat, 0.0, best=0.1, min_best=0.2)  # off
    assert not off_topic(query, chat, 0.55, best=0.1, min_best=0.0)  # off
    assert not off_topic(query, [*chat, said("c", "[D2:1] Ines: hello", 0.56)], 0.55, 0.1, 0.2)  # a paraphrase
    assert not off_topic("What type of workout did Ravi do?", chat, 0.55, 0.1, 0.2)  # every topic word held
    assert not off_topic("What about Ravi?", chat, 0.55, 0.1, 0.2)  # nothing but a name: nothing to miss
    assert not off_topic("What did Ravi do on 17 January 2024?", chat[:1], 0.55, 0.1, 0.2)  # a name and a date
    assert unheld_topic_words("Where was Ravi in Sept 2023, on the 3rd, at 5pm last Monday?", chat) == []
    assert not off_topic(query, [], 0.55, 0.0, 0.2)
    chat[1] = said("b", "[D1:2] Ines: Nice, which workout?", 0.50, bm25=0.0)
    p = FusionParams(0.2, 0.8, 0.0, 0.0, method="score", min_topic_cosine=0.55, min_topic_score=0.2)
    assert fuse(chat, p, today=TODAY, k=5, query=query) == []
    assert len(fuse(chat, replace(p, min_topic_score=0.05), today=TODAY, k=5, query=query)) == 2  # its best is above
    assert len(fuse(chat, p, today=TODAY, k=5)) == 2  # without the query: no such test
    rrf = replace(p, method="rrf")  # a rank's score says nothing of the match: words and cosine decide
    assert fuse(chat, rrf, today=TODAY, k=5, query=query) == []
    assert len(fuse(chat, rrf, today=TODAY, k=5, query="What workout did Ravi do?")) == 2
    text_alone = replace(p, use_vector=False)  # no cosines to trust: the text side decides, min_text_score abstains
    assert [h.chunk_id for h in fuse(chat, text_alone, today=TODAY, k=5, query=query)] == ["a"]


def test_another_spelling_of_a_speakers_name_is_no_topic_word() -> None:
    """People spell names several ways: "Muhammad" or "Mohamed" asked of a chat where "Muhhamed"
    speaks is a question about him, not about something the chat never mentions (REALTALK: 15 of
    the questions the off-topic rule refused). A word merely near a name is still a topic word."""
    chat = [said("a", "[D1:1] Muhhamed: my drive to work takes so long", 0.45),
            said("b", "[D1:2] Emi: that road is terrible", 0.40, bm25=0.0)]  # fmt: skip
    assert unheld_topic_words("How long is Muhammad's drive to work?", chat) == []
    assert unheld_topic_words("How long is Mohamed's drive to work?", chat) == []
    assert unheld_topic_words("Which blood group is Muhammad?", chat) == ["blood", "group"]
    assert unheld_topic_words("Did Emi ever ride an emu?", chat) == ["ride", "emu"]  # 0.67: not a spelling of Emi
    assert spells_name("kevn", "kevin") and not spells_name("devin", "kevin") and not spells_name("ed", "ad")
    # a word that merely starts like a name is no spelling of it: only a capitalised word may be one
    # (the first version kept "What colour is Jack's jacket?" over a chat where Jack never mentions one)
    jack = [said("a", "[D1:1] Jack: my drive to work takes so long", 0.45),
            said("b", "[D1:2] Carol: that road is terrible", 0.40, bm25=0.0),
            said("c", "[D1:3] Grace: I'd rather take the bus", 0.40, bm25=0.0)]  # fmt: skip
    assert unheld_topic_words("What colour is Jack's jacket?", jack) == ["colour", "jacket"]
    assert unheld_topic_words("Which car does Carol drive?", jack) == ["car"]
    assert unheld_topic_words("Does Grace like grapes?", jack) == ["like", "grape"]
    assert unheld_topic_words("Does Grace like Grapes?", jack) == ["like"]  # capitalised, as a name is written
    assert unheld_topic_words("How long is muhammad's drive to work?", chat) == ["muhammad"]  # lower case: a word


@pytest.mark.parametrize(
    "text",
    ["my dentist is dr. wong; call 555-0102 at 9:30!", "Upper Case\tand\nnew-lines_under score's", "", "  ...  ",
     "café au lait, naïve ﬁle", "東京の歯医者 at 3pm", "a\x0bb\x1cc d\x7fe"],
)  # fmt: skip
def test_distinct_words_are_the_word_pattern_runs(text: str) -> None:
    assert distinct_words(text) == set(re.findall(r"[0-9a-z]+", text))
