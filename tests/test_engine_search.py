"""Recall quality rules and the CLI's handling of awkward queries."""

from __future__ import annotations

from shared.engine.agent_format import NO_RESULTS, parse_recall
from shared.engine.api import Engine
from shared.engine.hybrid_search import Legs, RecallParams, bm25_leg, bm25_query_text, fuse
from shared.engine.identifiers import IdentifierPattern, query_identifiers
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.memory_reader import MemoryReader
from shared.engine.relevance_floor import floor_for
from shared.engine.store import MemoryStore
from shared.engine.text_analysis import ANALYZER, query_clauses, query_terms, scripts, words
from tests.conftest import write_conversation

# Planted once each, among template-alike decoys (other units, digit look-alikes).
PROBES = {
    "t-mt4471": "Ticket MT-4471 was opened for the K-2 machine spindle noise.",
    "t-n11": "Line N-11 upgrade approved; load will be 91 percent.",
    "t-k047": "Compressor K-047 vibration alarm; work order raised.",
}
DECOYS = [
    "Ticket MT-4417 was opened for the K-2 machine spindle noise.",
    "Ticket P-4471 was opened for the K-7 machine spindle noise.",
    "We counted 4471 items on the MT line for the K-2 machine.",
    "Line N-12 upgrade approved; load will be 91 percent.",
    "Line N-111 upgrade approved; load will be 93 percent.",
    "We need 11 trucks for line N upgrade.",
    "Compressor K-470 vibration alarm; work order raised.",
    "Compressor K-049 vibration alarm; work order raised.",
]


def _memory(tmp_path, embedder):
    src = tmp_path / "src"
    for cid, text in PROBES.items():
        write_conversation(src, cid, ["status check please", text, "thanks"])
    for i, text in enumerate(DECOYS):
        write_conversation(src, f"decoy{i}", ["status check please", text, "thanks"])
    index_tree(tmp_path / "home", src, embedder)
    return memory_dir(tmp_path / "home")


def test_identifiers_rank_their_document_first(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    for query, cid in [("MT-4471", "t-mt4471"), ("N-11", "t-n11"), ("K-047", "t-k047"),
                       ("status of MT-4471", "t-mt4471"), ("what did we decide about the N-11 upgrade load", "t-n11"),
                       ("K-047 compressor ticket", "t-k047")]:
        hits = parse_recall(engine.recall(memory, query, RecallParams(k=3, neighbors=0)))
        assert hits and hits[0].text == PROBES[cid], f"{query!r} ranked {hits[0].text!r} first"


def test_identifier_extraction_keeps_whole_codes():
    assert query_identifiers("what about MT-4471 and N-11, K-047? INV-80239 2024 mt-5512") == [
        "MT-4471", "N-11", "K-047", "INV-80239", "MT-5512"]
    assert query_identifiers("plain words only") == []


def test_sizes_versions_and_model_names_are_not_identifiers():
    for text in ["the 3-day offsite", "a 24-hour window", "UTF-8 text", "GPT-4 answers", "S3 bucket", "EC2 box",
                 "python3 venv", "Q3 plan", "our top-10 list", "covid-19 rules"]:
        assert query_identifiers(text) == [], text


def _one_memory(tmp_path, embedder, conversations: dict[str, list[str]]):
    src = tmp_path / "src"
    for cid, messages in conversations.items():
        write_conversation(src, cid, messages)
    index_tree(tmp_path / "home", src, embedder)
    return memory_dir(tmp_path / "home")


def test_among_turns_holding_the_identifier_the_rest_of_the_query_decides(tmp_path, embedder):
    memory = _one_memory(tmp_path, embedder, {
        "chat1": ["morning", "let's keep an eye on V-878", "ok"],
        "chat2": ["anything new?", "V-878 is noisy again, V-878 needs a look", "sure"],
        "dec": ["what about the old unit?", "Decision on V-878: we move it to standby duty next month.", "fine"],
        "other": ["and the spare?", "Decision on V-881: we move it to standby duty next month.", "fine"],
    })
    hits = parse_recall(Engine(embedder=embedder).recall(memory, "what was the decision to move V-878", RecallParams(k=3)))
    assert hits[0].text.startswith("Decision on V-878"), [h.text for h in hits]


def test_the_weakest_bm25_match_counts_as_a_match_when_the_leg_holds_every_turn_with_the_word():
    """Min-max over a BM25 leg that returned every matching turn put its last one at 0, as if it
    did not hold the word (a ticket's opening turn, longer than the mentions after it); scores
    now run from the best score the leg left out."""
    exhausted = Legs(dense=[(1, 0.9), (2, 0.9), (3, 0.9)], bm25=[(1, 2.0), (2, 1.0)], bm25_floor=0.0)
    fused = fuse(exhausted, dense_weight=0.0)
    assert fused[2] == 0.5 and fused[3] == 0.0
    cut = Legs(dense=[(1, 0.9), (2, 0.9)], bm25=[(1, 2.0), (2, 1.0)], bm25_floor=0.5)
    assert fuse(cut, dense_weight=0.0)[2] == 1 / 3


def _ticket_memory(tmp_path, embedder, chatter: int = 0):
    """MT-4471 opened (with its owner) in the oldest conversation, then only mentioned, in
    shorter turns of conversations that repeat it; `chatter` more one-line mentions after those."""
    src = tmp_path / "src"
    write_conversation(src, "opened", [
        "The conveyor on line 3 keeps drifting to the left and the belt edge is fraying.",
        "That sounds like belt misalignment; check the tail pulley tracking.",
        "I opened maintenance ticket MT-4471 for it. Priya owns it and wants the tracking checked before Friday.",
        "Good. Note the belt tension too when you check it."], day="2026-11-20")
    write_conversation(src, "update", ["Any update on MT-4471?", "MT-4471 is waiting for parts.", "ok thanks"], day="2026-11-25")
    write_conversation(src, "closing", ["Can we close MT-4471?", "Not yet, MT-4471 needs a sign-off.", "fine"], day="2026-11-27")
    for i in range(chatter):
        write_conversation(src, f"chatter{i}", [f"Ping {i} about MT-4471.", "ok"], day="2026-11-28")
    index_tree(tmp_path / "home", src, embedder)
    return memory_dir(tmp_path / "home")


OPENED = "I opened maintenance ticket MT-4471"


def test_a_bare_identifier_query_shows_first_the_turn_that_first_mentioned_it(tmp_path, embedder):
    memory = _ticket_memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    for query in ["MT-4471", "what is MT-4471 about", "status of MT-4471"]:
        hits = parse_recall(engine.recall(memory, query, RecallParams(k=3, floor=True)))
        assert len(hits) == 3 and hits[0].text.startswith(OPENED), (query, [h.text for h in hits])


def test_the_first_mention_is_found_below_the_identifier_legs_best_turns(tmp_path, embedder):
    memory = _ticket_memory(tmp_path, embedder, chatter=40)  # 40 shorter mentions rank above it
    hits = parse_recall(Engine(embedder=embedder).recall(memory, "MT-4471", RecallParams(k=3, floor=True)))
    assert hits[0].text.startswith(OPENED), [h.text for h in hits]


def test_a_bare_identifier_shows_each_conversation_naming_it_before_a_second_turn_of_one(tmp_path, embedder):
    """A newcomer's INC-20931: two short mentions of one conversation took the places after the
    opening turn, and the postmortem that also named it (in a longer turn) was left out."""
    src = tmp_path / "src"
    write_conversation(src, "opened", ["Payments fail at checkout.", "I opened incident INC-20931 for the card "
                                       "payment failures; Omar is the incident lead."], day="2026-11-02")
    write_conversation(src, "deploy", ["Is INC-20931 blocking the deploy?", "Yes, INC-20931 blocks it.",
                                       "Then we wait for INC-20931."], day="2026-11-04")
    write_conversation(src, "postmortem", ["Postmortem notes for INC-20931: the connection pool of the payment "
                                           "gateway was exhausted by retries; we capped retries and raised the pool "
                                           "size, and we will add an alert on pool saturation.", "thanks"],
                       day="2026-11-06")
    index_tree(tmp_path / "home", src, embedder)
    hits = Engine(embedder=embedder).search(memory_dir(tmp_path / "home"), "INC-20931", RecallParams(k=3, floor=True))
    assert [h.row.session_id for h in hits][0] == "opened"
    assert {h.row.session_id for h in hits} == {"opened", "deploy", "postmortem"}, [h.row.text for h in hits]


def test_a_query_word_held_beside_the_identifier_decides_over_the_first_mention(tmp_path, embedder):
    memory = _ticket_memory(tmp_path, embedder)
    hits = parse_recall(Engine(embedder=embedder).recall(memory, "when can we close MT-4471", RecallParams(k=3, floor=True)))
    assert hits[0].text == "Can we close MT-4471?", [h.text for h in hits]


def test_a_size_word_is_not_sorted_on_as_an_identifier(tmp_path, embedder):
    memory = _one_memory(tmp_path, embedder, {
        "cable": ["logistics", "Plan a 3 day buffer for the cable shipment.", "ok"],
        "offsite": ["the team trip?", "Offsite agenda: strategy review, then hiking, then the retro.", "great"],
    })
    hits = parse_recall(Engine(embedder=embedder).recall(memory, "what was the 3-day offsite agenda", RecallParams(k=2)))
    assert hits[0].text.startswith("Offsite agenda"), [h.text for h in hits]


def test_inflected_russian_question_finds_the_turn(tmp_path, embedder):
    memory = _one_memory(tmp_path, embedder, {
        "ru1": ["Насос Н-012 опять течёт.", "Завёл заявку ЗН-48213 по течи сальника на насосе Н-012.", "Спасибо."],
        "ru2": ["Компрессор шумит.", "Ольга взялась за заказ запчастей для компрессора К-007.", "Хорошо."],
        "ru3": ["Что с прессом?", "Проверка ОТК на прессе П-003 показала брак 2,5% в партии.", "Понял."],
    })
    engine = Engine(embedder=embedder)
    for query, expected in [("течь сальника у насосов", "Завёл заявку"), ("кто взял заказы запчастей", "Ольга"),
                            ("какой брак показали проверки прессов", "Проверка ОТК")]:
        hits = parse_recall(engine.recall(memory, query, RecallParams(k=1)))
        assert hits and hits[0].text.startswith(expected), (query, [h.text for h in hits])


def test_identifiers_listed_with_commas_or_slashes_are_each_their_own_phrase(tmp_path, embedder):
    assert query_clauses("N-11,MT-4471") == ["n 11", "mt 4471"]
    assert query_clauses("P-101/P-102 status") == ["p 101", "p 102", "status"]
    memory = _one_memory(tmp_path, embedder, {
        "a": ["pump check", "P-101 passed its pressure test.", "ok"],
        "b": ["and the other?", "P-102 failed its pressure test.", "noted"],
    })
    answer = Engine(embedder=embedder).recall(memory, "P-101/P-102", RecallParams(k=2, neighbors=0))
    assert "P-101 passed" in answer and "P-102 failed" in answer, answer


def test_query_terms_drop_stop_words_and_stem_each_script():
    assert query_terms("What did Caroline decide about the paintings?") == ["carolin", "decid", "paint"]
    assert query_terms("Кто взялся за отбраковку насосов?") == ["взял", "отбраковк", "насос"]
    assert query_terms("what is it") == ["what", "is", "it"]


def test_any_user_text_parses_as_a_bm25_query(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    store = MemoryStore.open(memory)
    try:
        for q in ['Caroline\'s "plan" (v2): AND OR NOT?', "-- -k 100", "*:* all", "field:value", ")))(((x", "MT-4471?"]:
            text = bm25_query_text(q)
            assert text, f"{q!r} has words, so it must search some"
            store.fts.parse_query(text, ["text"])  # raises ValueError if it does not parse
            engine.recall(memory, q, RecallParams())  # must not raise
    finally:
        store.close()
    assert bm25_query_text("\\ ---") == "" and engine.recall(memory, "\\ ---", RecallParams(floor=True)) == NO_RESULTS
    assert bm25_query_text("MT-4471?") == '"mt 4471"'


def test_gibberish_and_off_topic_queries_say_no_results(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    # Character runs read as plausible text to the tokenizer and sit close to "thanks" by cosine.
    for q in ["xyzzy plugh", "qwertyuiop asdf", "recipe for chocolate cake", "aaaaaaaaaa", "hahaha", "zzzz zzzz"]:
        assert engine.recall(memory, q, RecallParams(floor=True)) == NO_RESULTS, q
        assert engine.recall(memory, q, RecallParams()) != NO_RESULTS, "without the floor it answers"
    assert "vibration alarm" in engine.recall(memory, "compressor vibration alarm", RecallParams(k=1, floor=True))


def test_a_query_of_stop_words_alone_says_no_results(tmp_path, embedder):
    """"the" shares a word with every turn and sits past the bars of short ones by cosine: it was
    answered by three passages it asked nothing of."""
    memory = _memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    for q in ["the", "and the", "и в"]:
        assert engine.recall(memory, q, RecallParams(floor=True)) == NO_RESULTS, q
    assert "vibration alarm" in engine.recall(memory, "the vibration alarm", RecallParams(k=1, floor=True))


def test_a_codename_said_once_in_a_long_turn_is_found_though_its_cosine_is_under_the_floor(tmp_path, embedder):
    """An SRE trial asked for a made-up word posted in one turn of several sentences: BM25 had the
    turn first, but its cosine to the bare word was under the floor, and the answer was
    "nothing relevant". A turn that holds every word of the query clears the floor."""
    turn = ("About the office move next month, we postponed the honest tools and the codeword gelavukov came up. The "
            "rough risks were estimated again because the weather looked detailed after 33 days of deadline. The "
            "surprising options were estimated again because the schedule looked rough after 40 days of notes. The "
            "tedious notes were considered again because the weather looked expensive after 65 days of costs. The "
            "tedious materials were compared again because the neighbours looked expensive after 35 days of costs.")
    memory = _one_memory(tmp_path, embedder, {
        "office": [turn, "The pump seal on line two was replaced on Monday after the pressure test failed twice in a "
                         "row, and the spare parts came from the north depot."],
        "budget": ["About the budget review, we moved the careful slides and the plan came up. The quiet costs were "
                   "compared again because the schedule looked late after 12 days of notes.",
                   "About the plant walk, we checked the noisy pumps and the spare parts came up. The rough readings "
                   "were logged again because the weather looked cold after 20 days of work."],
    })
    engine = Engine(embedder=embedder)
    with engine.lease(memory) as reader, reader.fresh():
        for query in ["gelavukov", "what is gelavukov?"]:
            best = reader.nearest_scored(embedder.embed_query(query), 1, reader.filter_mask(None, None))[0][1]
            assert best < floor_for(embedder.spec.model_id).with_words, f"{query}: the cosine alone would refuse it"
    for query in ["gelavukov", "what is gelavukov?"]:
        assert "the codeword gelavukov came up" in engine.recall(memory, query, RecallParams(k=1, floor=True)), query
    # Every word must be in one turn: a word never said, or one said beside one never said, is still refused.
    for never_said in ["tomirasek", "gelavukov tomirasek"]:
        assert engine.recall(memory, never_said, RecallParams(floor=True)) == NO_RESULTS, never_said


def test_a_word_said_once_brings_back_the_turn_that_holds_it_not_k_unrelated_ones(tmp_path, embedder):
    """A newcomer asked for a codename said once: the turn came first, then two passages that
    shared no word with it and were under the floor's bar, there only to fill k places."""
    memory = _one_memory(tmp_path, embedder, {
        "vault": ["The vault migration got the codename tarnowick, and the budget is 48k.", "noted"],
        "pump": ["The pump seal on line two was replaced on Monday after the pressure test failed twice.",
                 "The spare parts came from the north depot."],
        "trip": ["We booked the train to Vienna for the conference in May.", "The hotel is near the station."],
    })
    engine = Engine(embedder=embedder)
    hits = engine.search(memory, "tarnowick", RecallParams(k=3, floor=True))
    assert [h.row.text for h in hits] == ["The vault migration got the codename tarnowick, and the budget is 48k."]
    assert len(engine.search(memory, "tarnowick", RecallParams(k=3))) == 3, "without the floor it fills k"
    # Passages as close as the bar stay, whether or not they share a word.
    pump = engine.search(memory, "pump seal replaced", RecallParams(k=3, floor=True, explain=True))
    assert "pump seal" in pump[0].row.text
    floor = floor_for(embedder.spec.model_id)
    assert all(h.explain.bm25_rank is not None or h.explain.dense_score >= floor.with_words for h in pump)


def test_a_one_word_number_or_code_brings_back_only_the_turns_that_hold_it(tmp_path, embedder):
    """A newcomer asked for `1069.5` and `billing-stg-02`: the turn holding each came first, then
    passages sharing nothing with it whose cosines (0.82) cleared the floor's bar."""
    memory = _one_memory(tmp_path, embedder, {
        "forecast": ["Which forecast scenario do we use as the base case?",
                     "Base case: hyperbolic decline, q0 1500 units/day, Di 0.25/yr, b 0.6 - 1069.5 units/day at 18 months."],
        "upgrade": ["Let's settle the N-11 upgrade. Expected load is about 2185 of 2400 units/day.",
                    "That is 91%: acceptable but tight. Decision: proceed with the N-11 upgrade."],
        "staging": ["Where do we test the pg migration?", "Staging clone is billing-stg-02, refreshed nightly.",
                    "Run the pg migration there first."],
    })
    engine = Engine(embedder=embedder)
    for query, holder in [("1069.5", "Base case:"), ("billing-stg-02", "Staging clone")]:
        hits = engine.search(memory, query, RecallParams(k=3, floor=True))
        assert [h.row.text[:len(holder)] for h in hits] == [holder], (query, [h.row.text for h in hits])


def test_a_russian_question_over_english_chats_clears_the_floor_and_cyrillic_gibberish_does_not(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "en", ["status check please", "The pump seal was replaced on Monday.", "thanks"])
    write_conversation(src, "ja", ["進捗はどうですか", "来週の金曜日に東京タワーの点検を予定しています。", "了解です"])
    index_tree(tmp_path / "home", src, embedder)
    memory, engine = memory_dir(tmp_path / "home"), Engine(embedder=embedder)
    # No word can be shared across scripts, so the question faces the bar of questions that share one.
    answer = engine.recall(memory, "когда заменили уплотнение насоса в понедельник", RecallParams(k=1, floor=True))
    assert "The pump seal was replaced on Monday." in answer
    for mashing in ["фывапролдж", "йцукен шщзх", "ъъъ ыыы ььь"]:  # as close by cosine, but no language
        assert engine.recall(memory, mashing, RecallParams(floor=True)) == NO_RESULTS, mashing
    assert embedder.text_log_prob("когда заменили насос") > -4.0 > embedder.text_log_prob("фывапролдж")


def test_a_russian_question_about_an_english_chat_clears_the_floor_beside_russian_chats(tmp_path, embedder):
    """An integrator's memory held English and Russian chats: a Russian question about an English
    one was held to the same-script bar because a Russian turn was among its nearest passages,
    though the best one, in English, could share no word with it. 0 of 7 were answered."""
    memory = _one_memory(tmp_path, embedder, {
        "riga": ["Which hotel in Riga for December 23-27? Near the old town and the Christmas market.",
                 "Hotel Bergs is elegant; a cheaper option is Neiburgs, right in the old town."],
        "borsch": ["Напомни бабушкин рецепт борща на 3 литра кастрюлю.", "Свёкла, капуста, картофель, морковь, лук."],
        "doctor": ["Давление 135/85 — это высокое нормальное?", "Измеряйте в одно и то же время утром и вечером."],
    })
    engine = Engine(embedder=embedder)
    hits = engine.search(memory, "сколько стоил отель в Риге", RecallParams(k=1, floor=True))
    assert [h.row.session_id for h in hits] == ["riga"], [h.row.text for h in hits]
    for off_topic in ["как настроить VPN на роутере", "фывапролдж йцукен"]:
        assert engine.search(memory, off_topic, RecallParams(floor=True)) == [], off_topic


def test_characters_the_model_cannot_read_never_read_as_language(embedder):
    # sentencepiece scores its one unknown piece 0, the likeliest score there is: left so,
    # text in a script e5 lacks would pass the floor's language test better than English.
    for unreadable in ["ꙮꙮꙮ", "ᚠᚢᚦ ᚨᚱ"]:
        assert embedder.text_log_prob(unreadable) < -4.0 < embedder.text_log_prob("what did we decide"), unreadable
    assert embedder.text_log_prob("what did we decide about the pump 🦄") > -4.0  # one odd character is not a verdict


def test_scripts_are_told_apart_per_word():
    assert scripts("Насос MT-4471 東京 pump") == {"cyrillic", "latin", "cjk"}
    assert scripts("4471 — 12") == {"other"} and scripts("") == set()


def test_explain_shows_how_each_hit_was_scored_and_only_on_request(tmp_path, embedder, run_engine):
    memory = _memory(tmp_path, embedder)
    plain = run_engine("recall", "--memory", str(memory), "-k", "2", "--", "K-047 compressor ticket")
    explained = run_engine("recall", "--memory", str(memory), "-k", "2", "--explain", "--", "K-047 compressor ticket")
    assert plain.returncode == 0 and explained.returncode == 0, explained.stderr
    assert "  ? " not in plain.stdout
    lines = [line for line in explained.stdout.splitlines() if line.startswith("  ? ")]
    assert len(lines) == 2 and "dense #" in lines[0] and "bm25 #" in lines[0] and "identifier +0.50" in lines[0]
    assert "recency x" in lines[0] and "fused " in lines[0] and "session +" in lines[0]
    assert [h.text for h in parse_recall(explained.stdout)] == [h.text for h in parse_recall(plain.stdout)]


def test_a_memory_indexed_before_stemming_is_searched_as_built_and_reanalysed_on_next_write(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)
    store = MemoryStore.open(memory)
    try:
        store.conn.execute("DELETE FROM meta WHERE key='fts_analyzer'")  # as written before the analyzer stamp
        assert store.fts_analyzer() == ""
    finally:
        store.close()
    assert bm25_query_text("Tickets opened", "") == '"Tickets" "opened"'
    assert PROBES["t-mt4471"] in Engine(embedder=embedder).recall(memory, "MT-4471", RecallParams(k=1))
    write_conversation(tmp_path / "src", "late", ["one more", "Pump P-777 serviced.", "ok"])
    index_tree(tmp_path / "home", tmp_path / "src", embedder)
    store = MemoryStore.open(memory)
    try:
        assert store.fts_analyzer() == ANALYZER
    finally:
        store.close()
    hits = parse_recall(Engine(embedder=embedder).recall(memory, "tickets opening spindle", RecallParams(k=3)))
    assert any(h.text == PROBES["t-mt4471"] for h in hits), "stems match after the rebuild"


def test_flag_like_queries_are_searched_as_text(tmp_path, embedder, run_engine):
    memory = _memory(tmp_path, embedder)
    out = run_engine("recall", "--memory", str(memory), "-k", "1", "--", "-k", "100", "spindle", "noise")
    assert out.returncode == 0, out.stderr
    assert len(parse_recall(out.stdout)) == 1, "`-k 100` after -- is the query, not a flag"
    out = run_engine("recall", "--memory", str(memory), "--", "--candidates", "MT-4471")
    assert out.returncode == 0 and PROBES["t-mt4471"] in out.stdout


def test_empty_memory_and_empty_query_say_no_results(tmp_path, embedder, run_engine):
    memory = _memory(tmp_path, embedder)
    assert Engine(embedder=embedder).recall(memory, "   ", RecallParams()) == "no results"
    out = run_engine("recall", "--memory", str(tmp_path / "nowhere"), "anything")
    assert out.returncode == 1 and out.stderr.startswith("Error: no index yet")


def test_hits_carry_neighbouring_turns_and_dates(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "c", ["Which feed broke the reconciliation?", "Feed F-204 had a gap; escalate to Priya.", "ok"], day="2026-09-26")
    index_tree(tmp_path / "home", src, embedder)
    out = Engine(embedder=embedder).recall(memory_dir(tmp_path / "home"), "F-204 gap", RecallParams(k=1))
    hit = parse_recall(out)[0]
    assert hit.ts.startswith("2026-09-26") and "F-204" in hit.text
    assert [(role, seq) for role, seq, _ in hit.neighbours] == [("user", 0), ("user", 2)]


def test_neighbour_previews_never_repeat_a_turn_the_answer_shows(tmp_path, embedder):
    """Two adjacent turns both hit: funes' seq window would preview each beside the other, so
    each opening is read twice. Neither is a preview now (each is shown whole), a freed preview
    goes one turn further out, and the answer holds no more previews than the window would (4)."""
    src = tmp_path / "src"
    write_conversation(src, "c", ["morning all", "Feed F-204 had a gap in the night run.",
                                  "The F-204 export job runs upstream.", "Priya will rerun it by Friday.",
                                  "ok, Friday then", "see you"])
    index_tree(tmp_path / "home", src, embedder)
    hits = parse_recall(Engine(embedder=embedder).recall(memory_dir(tmp_path / "home"), "F-204 gap", RecallParams(k=2)))
    assert [h.text for h in hits] == ["Feed F-204 had a gap in the night run.", "The F-204 export job runs upstream."]
    previews = [[seq for _, seq, _ in h.neighbours] for h in hits]
    # the better hit previews 0, not the lower hit 2; the lower one previews 3 and 4, not the better hit 1
    assert previews == [[0], [3, 4]], previews


def test_filters_by_block_type_and_harness(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    assert engine.recall(memory, "MT-4471", RecallParams(block_type="thinking")) == "no results"
    assert engine.recall(memory, "MT-4471", RecallParams(harness="codex")) == "no results"
    assert "MT-4471" in engine.recall(memory, "MT-4471", RecallParams(harness="copilot"))


def test_rerank_runs_only_when_pool_is_four_times_k(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)

    class ReverseAlphabet:  # a stand-in cross-encoder: it only has to be observable
        name = "probe"
        calls = 0

        def scores(self, query, texts):
            import numpy as np

            ReverseAlphabet.calls += 1
            return np.array([1.0 if "K-049" in t else 0.1 for t in texts])

    engine = Engine(embedder=embedder, reranker=ReverseAlphabet())
    engine.recall(memory, "compressor alarm", RecallParams(k=8, candidates=30))  # pool of 30 < 4 x 8
    assert ReverseAlphabet.calls == 0
    out = engine.recall(memory, "compressor alarm", RecallParams(k=2, candidates=30, neighbors=0))
    assert ReverseAlphabet.calls == 1
    assert "K-049" in parse_recall(out)[0].text


def test_version_and_usage_errors_follow_funes_exit_codes(run_engine):
    version = run_engine("--version")
    assert version.returncode == 0 and version.stdout.startswith("recall-engine ")
    assert run_engine("recall").returncode == 2, "a usage error (no query) exits 2"
    assert run_engine("nonsense-command").returncode == 2


async def test_mcp_recall_takes_explain_and_candidates_and_stays_funes_shaped_without(tmp_path, embedder):
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport

    from tests.conftest import engine_cli

    memory = _memory(tmp_path, embedder)
    async with Client(StdioTransport(engine_cli(), ["mcp", str(memory)], keep_alive=True)) as client:
        plain = (await client.call_tool("recall", {"query": "MT-4471 spindle", "k": 2})).content[0].text
        explained = (await client.call_tool("recall", {"query": "MT-4471 spindle", "k": 2, "candidates": 8,
                                                       "explain": True})).content[0].text
        nothing = (await client.call_tool("recall", {"query": "xyzzy plugh"})).content[0].text
    assert "  ? " not in plain and explained.count("\n  ? dense") == 2
    assert parse_recall(plain)[0].text == PROBES["t-mt4471"] == parse_recall(explained)[0].text
    assert nothing == NO_RESULTS


def test_a_joined_word_with_a_number_stays_one_phrase_in_the_lexical_query():
    # As free terms, `p` and `003` would match every unit of the P-series alike.
    assert bm25_query_text("what was decided about P-003") == '"decid" "p 003"'
    assert bm25_query_text("Caroline's e-mail") == '"carolin" "e" "mail"'


def test_a_question_naming_a_day_or_month_finds_the_turns_of_that_date(tmp_path, embedder):
    src = tmp_path / "src"
    # The same words on three dates: only the date can tell them apart.
    for cid, day in [("march", "2022-03-14"), ("nov9", "2022-11-09"), ("nov21", "2022-11-21")]:
        write_conversation(src, cid, ["Any news?", f"We tried the new dish today ({cid}).", "nice"], day=day)
    index_tree(tmp_path / "home", src, embedder)
    engine, memory = Engine(embedder=embedder), memory_dir(tmp_path / "home")
    for query, expected in [("What dish did we try on 9 November, 2022?", "(nov9)"),
                            ("what new dish did we try in March", "(march)"),
                            ("какое блюдо мы пробовали 21 ноября", "(nov21)")]:
        hits = parse_recall(engine.recall(memory, query, RecallParams(k=1, neighbors=0)))
        assert hits and expected in hits[0].text, (query, [h.text for h in hits])


def test_a_bare_number_in_a_question_matches_no_turn_by_its_date(tmp_path, embedder):
    src = tmp_path / "src"
    # Turns of the 3rd and the 10th that share no word with the questions but their day's number.
    for i in range(4):
        write_conversation(src, f"oct3-{i}", [f"Plan the garden beds, part {'abcd'[i]}.", "Tomatoes first."], day="2026-10-03")
        write_conversation(src, f"oct10-{i}", [f"Pick a paint colour, room {'abcd'[i]}.", "Sage green."], day="2026-10-10")
    write_conversation(src, "config", ["Which setting broke the build?", "Line 3 of the YAML had a tab."], day="2026-09-20")
    write_conversation(src, "bugs", ["Rank the open issues.", "Here is the top 10 list of crashes."], day="2026-09-21")
    write_conversation(src, "invoice", ["When do we pay?", "The invoice is due 7 Oct."], day="2026-09-22")
    index_tree(tmp_path / "home", src, embedder)
    reader = MemoryReader(memory_dir(tmp_path / "home"))
    try:
        reader.refresh()
        mask = reader.filter_mask(None, None)

        def lexical_hits(query: str) -> list[str]:
            legs = bm25_leg(reader, bm25_query_text(query, reader.fts_analyzer), 20, mask)
            rows = reader.store.rows([rid for rid, _ in legs])
            return list(dict.fromkeys(rows[rid].session_id for rid, _ in legs))

        for query, expected in [("what was on line 3", ["config"]), ("show me the top 10", ["bugs"])]:
            assert lexical_hits(query) == expected, query
        # The month's name still matches the whole month; the day puts its own turns first.
        for query, day in [("what did we do on 3 October", "oct3-"), ("October 10th", "oct10-"), ("2026-10-10", "oct10-"),
                           ("что было 3 октября", "oct3-"), ("Oct. 3", "oct3-")]:
            found = lexical_hits(query)
            assert all(s.startswith(day) for s in found[:4]), (query, found)
        # A date a turn writes in its text is the same term as the question's.
        assert lexical_hits("which bill is due on 2026-10-07")[0] == "invoice"
        assert lexical_hits("what is due October 7th")[0] == "invoice"
    finally:
        reader.close()


def test_a_question_and_a_turn_name_a_date_alike_and_nothing_else_becomes_one():
    from shared.engine.text_analysis import _date_stems, dates_as_terms, distinct_stems, fts_text, turn_stems

    for question, written in [("on 9 November", "November 9th"), ("Nov. 9", "the 9th of November"),
                              ("2022-11-09", "2022-11-09T10:00"), ("9-го ноября", "9 ноября"),
                              ("due May 9", "moved to May 9th at noon")]:
        day = "m5d9" if "May" in question else "2022m11d9" if "2022" in question else "m11d9"
        assert day in query_clauses(question) and day in distinct_stems(written), (question, written)
    # With its year written, a date is that day exactly, as an ISO date is, and one term either way.
    assert {"novemb", "2022m11d9", "2022"} == set(query_clauses("what did we do on 9 November, 2022"))
    assert "2022m11d9" in distinct_stems("2022-11-09 x") and "2022m11d9" in _date_stems("2022-11-09")
    for text in ["in May 3 people joined", "which of the 10 may conflict", "Python May 3.11", "N-11 October",
                 "meeting at 9:30 November", "+7 912 345 12 May", "due 9 ſeptember", "step 2\nNovember was cold"]:
        assert dates_as_terms(text) == text, text
    # A turn's stored stems are its text's and its date's, each analysed alone.
    for text, ts in [("the answer is step 2", "2022-11-09T10:00:00Z"), ("Room 9", "2022-11-09T10:00:00Z"),
                     ("due Nov 9th", "2022-11-09T10:00:00Z"), ("ok", "9 Nov 2022")]:
        assert set(turn_stems(fts_text(text, ts)).split()) == distinct_stems(text) | _date_stems(ts[:10]), (text, ts)


def test_a_memory_of_the_previous_stemming_analyzer_is_still_queried_with_stems():
    assert bm25_query_text("Tickets opened", "snowball-en-ru-1") == bm25_query_text("Tickets opened") == '"ticket" "open"'


def test_chinese_japanese_and_korean_runs_are_searched_as_character_pairs():
    assert words("東京タワーの件 MT-4471 한국어") == ["東京", "京タ", "タワ", "ワー", "ーの", "の件", "mt", "4471", "한국", "국어"]
    assert words("猫 日本") == ["猫", "日本"]  # a run of one or two characters is its own term
    assert query_clauses("MT-4471の件について") == ["mt 4471", "の件", "件に", "につ", "つい", "いて"]


def test_bm25_finds_a_cjk_turn_from_a_question_worded_differently(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "ja", ["進捗はどうですか", "来週の金曜日に東京タワーの点検を予定しています。", "了解です"])
    write_conversation(src, "zh", ["你好", "我们决定把服务器迁移到上海的数据中心。", "好的"])
    write_conversation(src, "other", ["status check please", "The pump seal was replaced on Monday.", "thanks"])
    index_tree(tmp_path / "home", src, embedder)
    reader = MemoryReader(memory_dir(tmp_path / "home"))
    try:
        reader.refresh()
        mask = reader.filter_mask(None, None)
        for question, expected in [("東京タワーの点検はいつ?", "東京タワーの点検"), ("服务器迁移到哪里", "服务器迁移到上海")]:
            legs = bm25_leg(reader, bm25_query_text(question, reader.fts_analyzer), 3, mask)
            assert legs, question
            assert expected in reader.store.rows([legs[0][0]])[legs[0][0]].text, question
    finally:
        reader.close()


def test_an_identifier_matches_as_its_full_expression_would_and_compiles_only_for_texts_holding_its_digits():
    import re

    def plain(ident: str) -> re.Pattern[str]:  # the expression, tested against every text
        body = r"[-\s_]?".join(re.escape(p) for p in re.findall(r"[^\W\d_]+|\d+", ident))
        return re.compile(rf"(?<![^\W_]){body}(?![^\W_])", re.IGNORECASE)

    texts = [*PROBES.values(), *DECOYS, "mt4471 again", "MT 4471.", "xMT-4471", "MT-44711", "MT_4471", "MT--4471",
             "\u212aA-047 (Kelvin sign)", "ka-047", "INV-80239-B shipped", "inv 80239 b", "MT-٤٤٧١", "", "4471",
             "MT-4470 before MT-4471", "MT-٤٤٧١ and MT-4471", "AB-99-AB-12-AB-12", "AB-12-AB-99-AB-12", "ab 12 ab12"]
    # The shape (letters, then so many digits) matches elsewhere first, or overlaps the match.
    for ident in ["MT-4471", "N-11", "K-047", "KA-047", "INV-80239-B", "MT-٤٤٧١", "AB-12-AB-12"]:
        fast, slow = IdentifierPattern(ident), plain(ident)
        for text in texts:
            assert fast.search(text) == (slow.search(text) is not None), (ident, text)
    unseen = IdentifierPattern("QZ-9182")
    assert not any(unseen.search(t) for t in texts) and unseen._regex is None, "no text held 9182: nothing compiled"


def test_a_time_with_one_conversation_shows_it_through_not_only_its_opening(tmp_path, embedder):
    from datetime import datetime, timezone

    src = tmp_path / "src"
    write_conversation(src, "long", [f"Step {w} of the migration plan." for w in "abcdefgh"], day="2026-10-08")
    write_conversation(src, "short", ["A short chat about lunch.", "Sounds good.", "See you at noon."], day="2026-10-07")
    index_tree(tmp_path / "home", src, embedder)
    engine, memory = Engine(embedder=embedder), memory_dir(tmp_path / "home")
    day = datetime(2026, 10, 8, tzinfo=timezone.utc).timestamp()
    # One conversation that day: its passages start past the previous one's neighbours.
    hits, conversations = engine.dated(memory, day, day + 86400, RecallParams(k=3, neighbors=1))
    assert [(h.row.session_id, h.row.seq) for h in hits] == [("long", 0), ("long", 3), ("long", 6)] and conversations == 1
    assert [n.seq for n in hits[1].neighbours] == [2, 4]
    # Every conversation of the time first, most recent first; then the later turns of each.
    hits, conversations = engine.dated(memory, day - 86400, day + 86400, RecallParams(k=3, neighbors=1))
    assert [(h.row.session_id, h.row.seq) for h in hits] == [("long", 0), ("long", 3), ("short", 0)] and conversations == 2
    # Three turns, one neighbour each side: the first and the last cover them all.
    hits = engine.dated(memory, day - 86400, day, RecallParams(k=3, neighbors=1)).hits
    assert [(h.row.session_id, h.row.seq) for h in hits] == [("short", 0), ("short", 2)]
    # More conversations than places: counted, so the answer can say some are not shown.
    hits, conversations = engine.dated(memory, day - 86400, day + 86400, RecallParams(k=1, neighbors=1))
    assert [h.row.session_id for h in hits] == ["long"] and conversations == 2
