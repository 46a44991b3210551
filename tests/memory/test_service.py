"""MemoryService on real LanceDB and real files, embedding through the local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
from datetime import date
from pathlib import Path

import pytest

from config.errors import BadRequest, NotFound
from memory import MemoryService, SearchHit
from tests.conftest import FakeClock
from tests.memory.conftest import embedding_inputs, eventually, memory_settings, openai_embedder, write
from tests.support.openai_server import OpenAIServer


async def test_search_finds_cites_and_abstains(service: MemoryService) -> None:
    hits = await service.search("main", "who is my dentist")
    assert hits and hits[0].path == "MEMORY.md"
    assert hits[0].citation == f"MEMORY.md#L{hits[0].start_line}-L{hits[0].end_line}"
    assert "Alice Wong" in hits[0].snippet
    assert hits[0].heading == "About me"
    assert all(0.0 <= h.score <= 1.0 for h in hits)
    assert await service.search("main", "zebra xylophone quantum") == []


async def test_a_repeated_query_is_embedded_once(service: MemoryService, openai_server: OpenAIServer) -> None:
    first = await service.search("main", "who is my dentist")
    openai_server.requests.clear()
    assert await service.search("main", "who is my dentist") == first
    assert embedding_inputs(openai_server) == []  # the kept vector, not a second request
    await service.search("main", "who grows basil")
    assert embedding_inputs(openai_server) == ["who grows basil"]


async def test_include_memory_md_false_leaves_it_out(service: MemoryService) -> None:
    assert any(h.path == "MEMORY.md" for h in await service.search("main", "green tea morning"))
    hits = await service.search("main", "green tea morning", include_memory_md=False)
    assert all(h.path != "MEMORY.md" for h in hits)


async def test_agents_are_kept_apart(service: MemoryService, tmp_path: Path) -> None:
    assert await service.search("other", "dentist") == []
    write(tmp_path / "workspaces" / "other", "MEMORY.md", "The other agent's dentist is Doctor Zed.\n")
    await service.reindex("other")
    [hit] = await service.search("other", "dentist")
    assert "Zed" in hit.snippet
    assert all("Zed" not in h.snippet for h in await service.search("main", "dentist"))


async def test_arguments_are_checked(service: MemoryService) -> None:
    with pytest.raises(NotFound):
        await service.search("nobody", "x")
    with pytest.raises(BadRequest):
        await service.search("main", "x", k=0)
    with pytest.raises(BadRequest):
        await service.search("main", "x", k=service.settings.search.candidates + 1)
    with pytest.raises(BadRequest):
        await service.search("main", "   ")


async def test_results_keep_their_order_as_k_grows(service: MemoryService, workspace: Path) -> None:
    for i in range(12):
        write(workspace, f"memory/notes/n{i}.md", f"Budget note {i}: the budget review covers cloud spend.\n")
    await service.reindex("main")
    full = await service.search("main", "budget cloud spend", k=15)
    assert len(full) >= 10
    for k in (1, 3, 7, len(full)):
        assert await service.search("main", "budget cloud spend", k=k) == full[:k]


async def test_only_changed_chunks_are_embedded(
    service: MemoryService, workspace: Path, openai_server: OpenAIServer
) -> None:
    # the watcher may index a change before reindex() does: count what reached the server
    openai_server.clear()
    paragraphs = "\n\n".join(f"Paragraph {i} about topic {i} and details." for i in range(10)) + "\n"
    write(workspace, "memory/long.md", paragraphs)
    await service.reindex("main")
    assert len(embedding_inputs(openai_server)) == 10
    openai_server.clear()
    text = paragraphs.replace("topic 4 and", "topic four and")
    (workspace / "memory/long.md").write_text(text)
    await service.reindex("main")
    assert embedding_inputs(openai_server) == ["Paragraph 4 about topic four and details.\n"]
    # moving paragraphs re-embeds nothing: their content hash is unchanged
    openai_server.clear()
    (workspace / "memory/long.md").write_text("New first line.\n\n" + text)
    await service.reindex("main")
    assert embedding_inputs(openai_server) == ["New first line.\n"]
    hits = await service.search("main", "topic four details")
    assert hits[0].citation == "memory/long.md#L11-L12"
    assert service.status()["agents"]["main"]["chunks"] == 4 + 11


async def test_a_file_read_mid_write_or_renamed_re_embeds_nothing(
    service: MemoryService, workspace: Path, openai_server: OpenAIServer
) -> None:
    paragraphs = "\n\n".join(f"Paragraph {i} about subject {i} and more." for i in range(8)) + "\n"
    write(workspace, "memory/log.md", paragraphs)
    await service.reindex("main")
    # an editor rewriting the file in place: the index reads it empty (or cut short), then whole
    openai_server.clear()
    (workspace / "memory/log.md").write_text("")
    await service.reindex("main")
    (workspace / "memory/log.md").write_text(paragraphs.replace("Paragraph 5", "Paragraph five"))
    await service.reindex("main")
    assert embedding_inputs(openai_server) == ["Paragraph five about subject 5 and more.\n"]
    # a renamed file keeps its vectors
    openai_server.clear()
    (workspace / "memory/log.md").rename(workspace / "memory/journal.md")
    await service.reindex("main")
    assert embedding_inputs(openai_server) == []
    [hit, *_] = await service.search("main", "subject 3")
    assert hit.path == "memory/journal.md"


async def test_removed_files_leave_the_index(service: MemoryService, workspace: Path) -> None:
    assert await service.search("main", "tomatoes basil")
    (workspace / "memory/projects/garden.md").unlink()
    await service.reindex("main")
    assert await service.search("main", "tomatoes basil") == []
    assert service.status()["files"] == 2


async def test_new_file_is_searchable_within_ten_seconds(service: MemoryService, workspace: Path) -> None:
    write(workspace, "memory/2026-11-30.md", "The cabin wifi password is hunter2.\n")

    async def found() -> list[SearchHit] | None:
        # (the hashing test embedder lets unrelated MEMORY.md chunks clear min_score: wait for the file)
        hits = await service.search("main", "cabin wifi password")
        return hits if any(h.path == "memory/2026-11-30.md" for h in hits) else None

    hits = await eventually(found, timeout=10)
    assert hits[0].path == "memory/2026-11-30.md"


async def test_new_workspace_is_found_by_the_polling_sweep(service: MemoryService, tmp_path: Path) -> None:
    write(tmp_path / "workspaces" / "other", "memory/a.md", "Kayak rental at the lake costs forty dollars.\n")
    assert await eventually(lambda: service.search("other", "kayak rental lake"), timeout=10)


async def test_restart_embeds_nothing_and_keeps_serving(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    uri = tmp_path / "memory.lance"
    for round_ in range(2):
        embedder = openai_embedder(openai_server)
        svc = MemoryService(memory_settings(), {"main": workspace}, uri, clock=clock, embedder=embedder)
        await svc.start()
        try:
            await eventually(lambda svc=svc: svc.ready)
            if round_ == 1:
                assert embedding_inputs(openai_server) == []
            assert await svc.search("main", "dentist Alice")
        finally:
            await svc.close()
            await embedder.close()
        openai_server.clear()


async def test_a_new_identity_rebuilds_and_swaps(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    uri = tmp_path / "memory.lance"
    first = openai_embedder(openai_server, model="embed-a")
    svc = MemoryService(memory_settings(), {"main": workspace}, uri, clock=clock, embedder=first)
    await svc.start()
    await eventually(lambda: svc.ready)
    old = svc.status()
    await svc.close()
    # same embedder, other chunking: a rebuild that reuses every vector by content hash
    openai_server.clear()
    svc = MemoryService(memory_settings(chunk_tokens=100), {"main": workspace}, uri, clock=clock, embedder=first)
    await svc.start()
    await eventually(lambda: svc.ready)
    assert svc.status()["identity"]["chunk_tokens"] == 100 and svc.status()["table"] != old["table"]
    assert svc.status()["last_run"]["rebuilt"] or svc.status()["chunks"] == old["chunks"]
    assert embedding_inputs(openai_server) == []
    await svc.close()
    # another model with other dimensions: everything re-embedded into a new table
    second = openai_embedder(openai_server, model="embed-b", dimensions=64)
    svc = MemoryService(memory_settings(), {"main": workspace}, uri, clock=clock, embedder=second)
    await svc.start()
    await eventually(lambda: svc.ready)
    status = svc.status()
    assert (status["identity"]["model"], status["identity"]["dimensions"]) == ("embed-b", 64)
    assert len(list(uri.glob("chunks_*"))) == 1  # the old table is gone
    assert await svc.search("main", "dentist Alice")
    await svc.close()
    await first.close()
    await second.close()


async def test_a_failed_rebuild_keeps_the_old_index_serving(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    uri = tmp_path / "memory.lance"
    first = openai_embedder(openai_server, model="embed-a")
    svc = MemoryService(memory_settings(), {"main": workspace}, uri, clock=clock, embedder=first)
    await svc.start()
    await eventually(lambda: svc.ready)
    old_table = svc.status()["table"]
    await svc.close()
    await first.close()

    port = openai_server.port
    second = openai_embedder(openai_server, model="embed-b")
    await second.start()  # the probe works, then the server goes away
    await openai_server.close()
    svc = MemoryService(memory_settings(), {"main": workspace}, uri, clock=clock, embedder=second)
    await svc.start()
    try:
        await eventually(lambda: svc.status()["last_error"])
        status = svc.status()
        assert status["table"] == old_table and status["identity"]["model"] == "embed-a"
        assert "rebuild failed" in status["last_error"]
        hits = await svc.search("main", "dentist Alice")  # full text of the old table still answers
        assert hits and hits[0].path == "MEMORY.md"
        assert len(list(uri.glob("chunks_*"))) == 1
        async with OpenAIServer(port=port):
            report = await svc.reindex()
            assert report.rebuilt and not report.errors
        assert svc.status()["identity"]["model"] == "embed-b"
    finally:
        await svc.close()
        await second.close()


async def test_files_get_and_append(service: MemoryService, workspace: Path) -> None:
    files = service.list_files("main")
    assert [f.path for f in files] == ["MEMORY.md", "memory/2026-11-29.md", "memory/projects/garden.md"]
    assert files[0].size == (workspace / "MEMORY.md").stat().st_size
    assert service.read_file("main", "MEMORY.md").startswith("# About me")
    assert await service.get("main", "MEMORY.md", 3, 3) == "My dentist is Doctor Alice Wong on Baker Street."
    with pytest.raises(BadRequest):
        service.read_file("main", "../other/MEMORY.md")
    with pytest.raises(NotFound):
        await service.get("main", "memory/none.md", None, None)
    with pytest.raises(NotFound):
        await service.get("main", "MEMORY.md", include_memory_md=False)

    result = await service.append_daily("main", "Parking spot is B12.\nParking spot is B12.", today=date(2026, 11, 30))
    assert (result.path, result.appended, result.skipped) == ("memory/2026-11-30.md", 1, 1)
    again = await service.append_daily("main", "Parking spot is B12.", today=date(2026, 11, 30))
    assert again.appended == 0
    hits = await eventually(lambda: service.search("main", "parking spot"), timeout=10)
    assert hits[0].citation == "memory/2026-11-30.md#L1-L1"
    with pytest.raises(BadRequest):
        await service.append_daily("main", "  \n", today=date(2026, 11, 30))


async def test_recency_decay_prefers_recent_daily_logs(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    write(workspace, "memory/2026-01-01.md", "Standup notes: deploy the billing service.\n")
    write(workspace, "memory/2026-11-28.md", "Standup notes: deploy the billing service!\n")
    embedder = openai_embedder(openai_server)
    settings = memory_settings(search={"recency_half_life_days": 30})
    svc = MemoryService(settings, {"main": workspace}, tmp_path / "db", clock=clock, embedder=embedder)
    await svc.start()
    try:
        await eventually(lambda: svc.ready)
        hits = await svc.search("main", "standup deploy billing service")
        assert [h.path for h in hits[:2]] == ["memory/2026-11-28.md", "memory/2026-01-01.md"]
        assert hits[1].score < hits[0].score / 100
    finally:
        await svc.close()
        await embedder.close()


async def test_mmr_setting_diversifies_the_results(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    """memory.search.mmr reaches the search: the same note written three times gives way to a
    different fact about the same thing; without it the three repeats come first."""
    write(workspace, "memory/dentist.md", "Dentist appointment with Doctor Wong on Tuesday.\n\n"
          "Dentist appointment: Doctor Wong, Tuesday!\n\nReminder: dentist appointment with Doctor Wong on Tuesday.\n\n"
          "Dentist bills go to the blue insurance folder.\n")  # fmt: skip
    embedder = openai_embedder(openai_server)
    off = {"min_score": 0, "min_text_score": 0}
    ws = {"main": workspace}
    plain = MemoryService(memory_settings(search=off), ws, tmp_path / "a", clock=clock, embedder=embedder)
    mmr = memory_settings(search={**off, "mmr": 0.3})
    diverse = MemoryService(mmr, ws, tmp_path / "b", clock=clock, embedder=embedder)
    await plain.start()
    await diverse.start()
    try:
        await eventually(lambda: plain.ready and diverse.ready)
        query = "dentist appointment Tuesday"
        first = [h.snippet for h in await plain.search("main", query, k=4)]
        assert all("appointment" in s for s in first[:3]) and "insurance" in first[3]
        second = [h.snippet for h in await diverse.search("main", query, k=4)]
        assert second[0] == first[0] and "insurance" in second[1]
    finally:
        await diverse.close()
        await plain.close()
        await embedder.close()


async def test_status_reports_the_index(service: MemoryService) -> None:
    status = service.status()
    assert status["ready"] is True
    assert (status["files"], status["chunks"], status["pending"]) == (3, 4, 0)
    assert status["identity"]["provider"] == "openai" and status["identity"]["dimensions"] == 256
    assert status["agents"]["main"] == {"files": 3, "chunks": 4}
    assert status["last_run"]["finished_at"].startswith("2026-11-30")
    progress: list[tuple[int, int]] = []
    report = await service.reindex(force=True, progress=lambda d, t: progress.append((d, t)))
    assert report.rebuilt and progress[0] == (0, 4) and progress[-1] == (4, 4)


async def test_close_is_quick_while_indexing(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    for i in range(50):
        write(workspace, f"memory/bulk/{i}.md", f"Bulk note {i}.\n")
    embedder = openai_embedder(openai_server)
    svc = MemoryService(memory_settings(), {"main": workspace}, tmp_path / "db", clock=clock, embedder=embedder)
    await svc.start()
    async with asyncio.timeout(10):
        await svc.close()
    await embedder.close()


async def test_an_unreadable_pointer_starts_a_new_index(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    uri = tmp_path / "memory.lance"
    uri.mkdir()
    (uri / "neotask-index.json").write_text('{"table": "chunks_gone", "identity": {}}')
    embedder = openai_embedder(openai_server)
    svc = MemoryService(memory_settings(), {"main": workspace}, uri, clock=clock, embedder=embedder)
    await svc.start()
    try:
        await eventually(lambda: svc.ready)
        assert await svc.search("main", "dentist Alice")
    finally:
        await svc.close()
        await embedder.close()


async def test_scopes_keep_their_files_apart(service: MemoryService, workspace: Path) -> None:
    """Issue 24, item 3: the shared scope (None) is every file outside memory/scopes/; a named scope
    only its folder; EVERY (the default: the owner's API) everything."""
    owner, bob = "memory/2026-11-30.md", "memory/scopes/dm-bob-1/2026-11-30.md"
    write(workspace, owner, "- The owner parks the car in bay seven.\n")
    write(workspace, bob, "- Bob parks the car in bay nine.\n")
    await service.reindex("main")
    query = "parks the car in bay"
    assert {owner, bob} <= {h.path for h in await service.search("main", query, k=10)}
    shared = {h.path for h in await service.search("main", query, k=10, scope=None)}
    assert owner in shared and not any(p.startswith("memory/scopes/") for p in shared)
    assert [h.path for h in await service.search("main", query, k=10, scope="dm-bob-1")] == [bob]
    assert await service.search("main", query, k=10, scope="dm-carol-2") == []
    assert "bay nine" in await service.get("main", bob, scope="dm-bob-1")
    for path, scope in ((bob, "dm-carol-2"), (bob, None), ("MEMORY.md", "dm-bob-1"), (owner, "dm-bob-1")):
        with pytest.raises(NotFound):
            await service.get("main", path, scope=scope)
    saved = await service.append_daily("main", "- Carol likes rooibos.", today=date(2026, 11, 30), scope="dm-carol-2")
    assert saved.path == "memory/scopes/dm-carol-2/2026-11-30.md"
    assert (workspace / saved.path).read_text() == "- Carol likes rooibos.\n"
    for bad in ("../x", "a/b", "", "-x", "a_b%"):
        with pytest.raises(BadRequest):
            await service.search("main", query, scope=bad)


async def test_a_question_about_a_person_finds_what_that_person_said(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    """In a chat both people's names are in every turn's indexed heading and context; a question
    naming one of them ranks that person's own turn first, above the other's reply on the same
    topic (which also gains from the turn after it)."""
    write(workspace, "memory/chat/2026-11-20.md", "# Ravi and Ines, 20 November 2026\n\n"
          "Ravi: Hey Ines, how was your weekend?\n\n"
          "Ines: Great! What cake did I bake? Cake for the whole street: I bake a cake every weekend.\n\n"
          "Ravi: Nice. Today my dad and I baked a plum cake. Best cake ever.\n\n"
          "Ines: That sounds delicious!\n\nRavi: It was. See you on Monday.\n")  # fmt: skip
    embedder = openai_embedder(openai_server)
    settings = memory_settings(search={"min_score": 0, "min_text_score": 0})
    svc = MemoryService(settings, {"main": workspace}, tmp_path / "db", clock=clock, embedder=embedder)
    await svc.start()
    try:
        await eventually(lambda: svc.ready)
        hits = await svc.search("main", "What cake did Ravi bake?", k=3)
        assert hits[0].snippet.startswith("Ravi: Nice. Today my dad and I baked"), [h.snippet for h in hits]
        ines = next(h for h in hits if h.snippet.startswith("Ines: Great!"))
        assert ines.text_score < hits[0].text_score  # "Ravi" is not in her turn's own lines
    finally:
        await svc.close()
        await embedder.close()


async def test_a_date_in_digits_finds_the_session_of_that_day(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    """A chat log's heading spells its day ("1 February 2024"); a question that writes it in
    digits ("01.02.2024", which shares no word with that heading but the year) is searched as
    memory spells it, so the turn of that day comes first, above closer wordings of other days."""
    sessions = (("1 January 2024", "What did I bake? A plum cake"),
                ("2 January 2024", "What did I bake? A lemon tart"),
                ("1 February 2024", "I baked an apple pie"))  # fmt: skip
    for n, (day, turn) in enumerate(sessions):
        write(workspace, f"memory/chat/session-{n}.md", f"# Ravi and Ines, {day}\n\n"
              f"Ines: Hi! How was your day?\n\nRavi: {turn}.\n\nInes: Nice!\n\nRavi: See you.\n")  # fmt: skip
    embedder = openai_embedder(openai_server)
    settings = memory_settings(search={"min_score": 0, "min_text_score": 0})
    svc = MemoryService(settings, {"main": workspace}, tmp_path / "db", clock=clock, embedder=embedder)
    await svc.start()
    try:
        await eventually(lambda: svc.ready)
        for query in ("What did Ravi bake on 01.02.2024?", "What did Ravi bake on 2024-02-01?"):
            hits = await svc.search("main", query, k=3)
            assert hits[0].path == "memory/chat/session-2.md", (query, [(h.path, h.snippet) for h in hits])
    finally:
        await svc.close()
        await embedder.close()


async def test_a_question_about_what_no_turn_mentions_gets_nothing(
    tmp_path: Path, workspace: Path, openai_server: OpenAIServer, clock: FakeClock
) -> None:
    """With search.min_topic_cosine on (off by default): a question about one of the chat's people
    on a topic no turn mentions gets no result (only the name matches, and nothing embeds close),
    while a question about what was said is answered."""
    write(workspace, "memory/chat/2026-11-20.md", "# Ravi and Ines, 20 November 2026\n\n"
          "Ines: Hi Ravi! What did you do today?\n\nRavi: I baked a plum cake with my dad.\n\n"
          "Ines: What is it, Ravi? What is this?\n\nRavi: Yes, we ate half of it. See you on Monday.\n")  # fmt: skip
    embedder = openai_embedder(openai_server)
    settings = memory_settings(search={"min_topic_cosine": 0.55})
    svc = MemoryService(settings, {"main": workspace}, tmp_path / "db", clock=clock, embedder=embedder)
    await svc.start()
    try:
        await eventually(lambda: svc.ready)
        assert await svc.search("main", "What is Ravi's blood type?") == [], [
            (h.snippet, h.score, h.vector_score) for h in await svc.search("main", "What is Ravi's blood type?")
        ]
        hits = await svc.search("main", "What did Ravi bake?")
        assert hits and hits[0].snippet.startswith("Ravi: I baked a plum cake")
    finally:
        await svc.close()
        await embedder.close()


async def test_a_fifo_in_the_memory_blocks_neither_indexing_nor_reads(service: MemoryService, workspace: Path) -> None:
    """A FIFO named ``*.md`` used to hang the indexing run (``reindex`` never returned, the index
    stayed stale) and every read of it."""
    import os

    os.mkfifo(workspace / "memory" / "pipe.md")
    write(workspace, "memory/2026-11-30.md", "- Booked the ferry to Vashon for Saturday.\n")
    report = await asyncio.wait_for(service.reindex(), 20)
    assert not report.errors
    assert "memory/pipe.md" not in [f.path for f in service.list_files("main")]
    hits = await asyncio.wait_for(service.search("main", "ferry Vashon"), 20)
    assert hits and hits[0].path == "memory/2026-11-30.md"
    with pytest.raises(NotFound):
        await asyncio.wait_for(service.get("main", "memory/pipe.md"), 20)


async def test_status_shows_how_far_an_indexing_pass_is(service: MemoryService, tmp_path: Path) -> None:
    """While a pass embeds, ``status()["progress"]`` (GET /v1/memory/status) gives the chunks
    embedded of those it must embed, the rate and the time left, and ``partial`` (which a search
    answer carries) is true; between passes the progress is None and the index not partial."""
    notes = "\n\n".join(f"Note {i}: the parcel for order {i} goes to locker {i % 7}." for i in range(150))
    write(tmp_path / "workspaces" / "other", "memory/parcels.md", notes + "\n")
    seen: list[dict[str, object]] = []
    partial: list[bool] = []

    def watch(done: int, total: int) -> None:
        seen.append(service.status()["progress"])
        partial.append(service.partial)

    assert not service.partial
    report = await service.reindex("other", progress=watch)
    assert report.chunks_embedded == 150 and seen[-1]["done"] == seen[-1]["total"] == 150
    middle = [p for p in seen if 0 < p["done"] < p["total"]]  # type: ignore[operator]
    assert middle, seen
    for p in middle:
        rate, left = float(p["chunks_per_second"]), float(p["seconds_left"])  # type: ignore[arg-type]
        assert rate > 0 and left == pytest.approx((p["total"] - p["done"]) / rate, abs=0.01), p  # type: ignore[operator]
    assert service.status()["progress"] is None
    # a search while chunks are left to embed says the index is partial
    assert partial[0] and not partial[-1] and not service.partial
