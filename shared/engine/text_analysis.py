"""What BM25 sees of a text and of a query: words, lower-cased, stemmed, stop words dropped.

Tokens are runs of letters and digits (so `MT-4471` is `mt 4471`, as tantivy's default
tokenizer splits it). Each word is stemmed by the Snowball stemmer of its own script: Cyrillic
words by the Russian one, Latin words by the English one (Porter2), words with digits never.
Deciding per word rather than per text keeps a Russian chat that names `pump`/`MT-4471`
matching the English forms too, and needs no language detector: the script *is* the language
decision for the two languages supported.

Chinese, Japanese and Korean write no spaces between words, so a run of their characters would
be one "word" that no question ever repeats exactly (the BM25 failure users of peer systems
report most). Such a run is indexed and searched as its overlapping character
pairs (`東京タワー` → `東京 京タ タワ ワー`), as Lucene's CJK analyser does: no dictionary, and a
question sharing a two-character word with a turn matches it. The dense leg (e5) is multilingual.

Measured on LoCoMo (issue 10): English stemming plus the full stop-word list on the query lifts
BM25 alone from R@8 0.55 to 0.65; tantivy's own 33-word list loses ~7 points of that. On the
Russian synthetic set a Russian stemmer lifts BM25 from 0.00-0.46 to 0.62-0.99 hit@3.

The indexed text is pre-stemmed here and handed to tantivy's default tokenizer, so the BM25
index needs no custom tokenizer registered on every open. `ANALYZER` stamps a memory's index:
a memory whose stamp differs has its BM25 index rebuilt on its next write (store.py) and is
queried the old way until then.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

import Stemmer

ANALYZER = "snowball-en-ru-cjk2-dates-4"
# Analyzers whose queries are built the same way (stems, stop words dropped): a memory indexed
# by one of them is queried with stems until its next write re-analyses it (store.py).
STEMMED_ANALYZERS = frozenset({"snowball-en-ru-1", "snowball-en-ru-2", "snowball-en-ru-cjk2-3", ANALYZER})

# Hiragana, Katakana, CJK ideographs (and extension A, compatibility), Hangul syllables.
_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD = re.compile(rf"[{_CJK_CHARS}]+|[^\W_{_CJK_CHARS}]+", re.UNICODE)
_CJK_RUN = re.compile(rf"[{_CJK_CHARS}]")
_CYRILLIC = re.compile(r"[а-яё]")
_LATIN = re.compile(r"[a-z]")
_DIGIT = re.compile(r"\d")

# NLTK's English list (179 words); contractions appear split, as the tokenizer splits them.
ENGLISH_STOP = frozenset("""
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers
herself it its itself they them their theirs themselves what which who whom this that these those am is
are was were be been being have has had having do does did doing a an the and but if or because as until
while of at by for with about against between into through during before after above below to from up
down in out on off over under again further then once here there when where why how all any both each few
more most other some such no nor not only own same so than too very s t can will just don should now d ll
m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma mightn mustn needn shan shouldn wasn weren
won wouldn
""".split())
# NLTK's Russian list, ё folded to е as the tokenizer does.
RUSSIAN_STOP = frozenset("""
и в во не что он на я с со как а то все она так его но да ты к у же вы за бы по только ее мне было вот от
меня еще нет о из ему теперь когда даже ну вдруг ли если уже или ни быть был него до вас нибудь опять уж
вам ведь там потом себя ничего ей может они тут где есть надо ней для мы тебя их чем была сам чтоб без
будто чего раз тоже себе под будет ж тогда кто этот того потому этого какой совсем ним здесь этом один
почти мой тем чтобы нее сейчас были куда зачем всех никогда можно при наконец два об другой хоть после
над больше тот через эти нас про всего них какая много разве три эту моя впрочем хорошо свою этой перед
иногда лучше чуть том нельзя такой им более всегда конечно всю между
""".split())
STOP_WORDS = ENGLISH_STOP | RUSSIAN_STOP

_STEMMERS = {"en": Stemmer.Stemmer("english"), "ru": Stemmer.Stemmer("russian")}


def scripts(text: str) -> set[str]:
    """The writing systems of a text's words, as BM25 can match them: latin, cyrillic, cjk, other."""
    found = set()
    for word in _WORD.findall(text.lower()):
        found.add("cjk" if _CJK_RUN.match(word) else "cyrillic" if _CYRILLIC.search(word)
                  else "latin" if _LATIN.search(word) else "other")
    return found - {"other"} or found


def _raw_words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("ё", "е"))


def words(text: str) -> list[str]:
    out: list[str] = []
    for word in _raw_words(text):
        if len(word) > 2 and _CJK_RUN.match(word):
            out.extend(word[i : i + 2] for i in range(len(word) - 1))
        else:
            out.append(word)
    return out


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    if _DIGIT.search(word):
        return word
    if _CYRILLIC.search(word):
        return _STEMMERS["ru"].stemWord(word)
    if _LATIN.search(word):
        return _STEMMERS["en"].stemWord(word)
    return word


@lru_cache(maxsize=8192)
def distinct_stems(text: str) -> frozenset[str]:
    """The distinct stems of `index_text(text)`; a text without CJK characters skips `words`'
    per-word split. Conversation evidence stems ~70 turns per recall, and the turns that match a
    memory's common words come back query after query: kept per text (8,192 texts, ~8 MB)."""
    text = dates_as_terms(text)
    if _CJK_RUN.search(text):
        return frozenset(map(stem, words(text)))
    return frozenset(map(stem, set(_raw_words(text))))


def forget_cached_texts() -> None:
    """Empty the caches keyed by what users wrote (turn texts of every tenant this process
    searched, their words, the last queries): called on a forget, so it leaves no copy here."""
    distinct_stems.cache_clear()
    stem.cache_clear()
    _query_clauses.cache_clear()


def held_stems(text: str, ts: str, stems: frozenset[str]) -> frozenset[str]:
    """Which of `stems` BM25 holds for a turn (`fts_text`): in its text or its date. Asked
    for a query's few stems of ~70 turns per recall, so no union of the turn's stems is built."""
    return (stems & distinct_stems(text)) | (stems & _date_stems(ts[:10]))  # date words: the day alone


@lru_cache(maxsize=4096)
def _date_stems(day: str) -> frozenset[str]:
    return frozenset(index_text(date_words(day)).split()) if day else frozenset()


def fts_text(chunk_text: str, ts: str) -> str:
    """What BM25 indexes for a turn: its text's stems plus its date in words, since many
    questions match only the date. Each analysed alone: "step 2" ending the text is no
    "2 November" with the date's month."""
    return f"{index_text(chunk_text)} {index_text(date_words(ts))}" if ts else index_text(chunk_text)


def turn_stems(fts: str) -> str:
    """A turn's distinct indexed stems (of its `fts_text`), space-separated, as stored beside it
    (store.py) so a recall reads them instead of stemming the turn again: for every turn they
    equal `held_stems`' text and date stems (tested)."""
    return " ".join(dict.fromkeys(fts.split()))


def index_text(text: str) -> str:
    """The text as BM25 indexes it: stems separated by spaces, every word kept (phrases work),
    its dates as the terms a question's dates become (`dates_as_terms`)."""
    return " ".join(stem(w) for w in words(dates_as_terms(text)))


def query_terms(query: str) -> list[str]:
    """The query's distinct stems without stop words; all of its words if nothing else is left
    ("what is it" still searches something)."""
    ws = words(dates_as_terms(query))
    content = [w for w in ws if w not in STOP_WORDS] or ws
    return list(dict.fromkeys(stem(w) for w in content))


_CLAUSE_SEPARATORS = re.compile(r"[\s,;/|()\[\]{}<>\"«»“”]+")


def query_clauses(query: str) -> list[str]:
    """`query_terms`, except that a joined word with a number in it (`P-003`, `N-11`, `3-day`)
    stays one phrase of its stems (`p 003`): as free terms its parts match every unit of the
    same series. Words are joined by hyphens, dots and the like, not by the separators of a
    list (`N-11,MT-4471`, `P-101/P-102`: two identifiers, not one four-word phrase)."""
    return list(_query_clauses(query))


@lru_cache(maxsize=64)
def _query_clauses(query: str) -> tuple[str, ...]:
    """Kept for the last queries: a recall asks for its query's clauses in its BM25 leg, its
    conversation evidence and its relevance floor (~30 us each)."""
    clauses: list[str] = []
    for token in _CLAUSE_SEPARATORS.split(dates_as_terms(query)):
        ws = words(token)
        pairs = [w for w in ws if _CJK_RUN.match(w)]  # `MT-4471の件`: the code, then its CJK pairs
        ws = [w for w in ws if not _CJK_RUN.match(w)]
        if len(ws) > 1 and any(w.isdigit() for w in ws):
            clauses.append(" ".join(stem(w) for w in ws))
        else:
            clauses.extend(stem(w) for w in ws if w not in STOP_WORDS)
        clauses.extend(pairs)
    return tuple(dict.fromkeys(clauses)) or tuple(query_terms(query))


_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
MONTHS_EN = "january february march april may june july august september october november december".split()
# Genitive, as a date is written and asked about («9 ноября», «в ноябре» stems alike).
MONTHS_RU = "января февраля марта апреля мая июня июля августа сентября октября ноября декабря".split()


def _day_term(month: int, day: int) -> str:
    """A day of the year as one term (`m11d9`): no word a person writes, so a bare number in a
    question ("line 9", "top 10") never matches every turn dated the 9th or the 10th."""
    return f"m{month}d{day}"


def date_words(ts: str) -> str:
    """A chunk's date as BM25 sees it: the month's name in English and Russian, the day of the
    year and the full date each as one term (`november ноября m11d9 2022m11d9`), so "on 9
    November, 2022", "2022-11-09" or «в ноябре» match the turns of that day or month and a
    bare number matches none. Measured on LoCoMo (issue 10): R@3 +1.4, R@8 +0.6 points over the
    ISO date alone; the day as one term instead of the ISO pieces and the bare day cost
    LoCoMo-dev one question of 759 at R@3 and one at R@8, 11 questions moving both ways
    (docs/benchmarks.md, round 28). An unparseable stamp stays as it is."""
    m = _ISO_DATE.match(ts)
    if not m or not 1 <= int(m[2]) <= 12:
        return ts[:10]
    month, day = int(m[2]), int(m[3])
    return f"{MONTHS_EN[month - 1]} {MONTHS_RU[month - 1]} {_day_term(month, day)} {m[1]}{_day_term(month, day)}"


# English names and their abbreviations ("Nov 9", "sept"); the Russian genitive («9 ноября»).
_MONTH_NUMBERS = {name: i + 1 for i, name in enumerate(MONTHS_EN)}
_MONTH_NUMBERS |= {name[:3]: i for name, i in _MONTH_NUMBERS.items()} | {"sept": 9}
_MONTH_NUMBERS |= {name: i + 1 for i, name in enumerate(MONTHS_RU)}
_MONTH = "|".join(sorted(_MONTH_NUMBERS, key=len, reverse=True))
# Month words that are common words too ("10 may fail", "we march 3 miles", "ask Jan 2 questions"):
# a date only when capitalised (May, March; Jan is a name as well), or with an ordinal, a year, a
# preposition before it, or nothing after it.
_AMBIGUOUS_MONTHS = frozenset({"may", "march", "mar", "jan"})
_NAMES_TOO = frozenset({"jan"})
_DATE_PREPOSITIONS = frozenset({"on", "of", "since", "from", "to", "until", "till", "through", "by", "before", "after"})
_SP = r"[^\S\n]+"  # spaces within a line: a number ending one line is no day of the next line's month
_NOT_A_PART = r"(?<![\w.,:/+-])(?<!\d )"  # not a piece of N-11, 3.11, 9:30, 1/12 or +7 912 345 12
_YEAR_AFTER = rf"(?=,?{_SP}(\d{{4}})\b)?"
_DATE = re.compile(
    rf"{_NOT_A_PART}(\d{{4}})-(\d{{2}})-(\d{{2}})(?=T\d|\b)"                                       # 2022-11-09
    rf"|{_NOT_A_PART}(\d{{1,2}})(st|nd|rd|th|-?го|-?е)?(?:{_SP}of)?{_SP}({_MONTH})\b\.?{_YEAR_AFTER}"  # 9th of Nov, 9 ноября
    rf"|\b({_MONTH})\.?{_SP}(?:the{_SP})?(\d{{1,2}})(st|nd|rd|th)?(?![\d:]|[.,/]\d)\b{_YEAR_AFTER}",  # Nov. 9th, 2022
    re.IGNORECASE)
_WORD_BEFORE = re.compile(r"(\w+)[^\S\n]*$")
_NOTHING_AFTER = re.compile(r"[^\S\n]*(?:$|[^\w\s])")


class DateMention(NamedTuple):
    """A date a text names: an ISO date (`exact`: that day) or a day beside a month's name,
    with the year written after it, if any."""

    start: int
    end: int
    month: int
    day: int
    year: int | None
    exact: bool
    name: str  # the month's word as written ("" for an ISO date)


def date_mentions(text: str) -> list[DateMention]:
    """The dates a text names, as BM25 (`dates_as_terms`) and the recall service's time windows
    both read them: one grammar, so a question's date and a turn's are the same term."""
    if not any(c.isdigit() for c in text):
        return []
    found = []
    for m in _DATE.finditer(text):
        if m[1]:
            found.append(DateMention(m.start(), m.end(), int(m[2]), int(m[3]), int(m[1]), True, ""))
            continue
        day_first = m[4] is not None
        number, ordinal, name, year = (m[4], m[5], m[6], m[7]) if day_first else (m[9], m[10], m[8], m[11])
        month = _MONTH_NUMBERS.get(name.lower())  # None for a letter IGNORECASE folds ("ſeptember")
        if month is None or not 1 <= int(number) <= 31 or not _reads_as_a_date(text, m, name, day_first, ordinal, year):
            continue
        found.append(DateMention(m.start(), m.end(), month, int(number), int(year) if year else None, False, name))
    return found


def _reads_as_a_date(text: str, m: re.Match, name: str, day_first: bool, ordinal: str | None, year: str | None) -> bool:
    """"in May 3 people joined", "in October 2 weeks before launch": a month, then a count. An
    ambiguous month word needs a capital (but Jan), an ordinal, a year, a preposition before it
    or nothing after it ("10 may fail", "we march 3 miles" are no dates)."""
    if ordinal or year:
        return True
    before = _WORD_BEFORE.search(text[max(0, m.start() - 40):m.start()])  # the word just before, not a scan from 0
    word_before = before[1].lower() if before else ""
    if not day_first and word_before in ("in", "during"):
        return False
    if name.lower() not in _AMBIGUOUS_MONTHS or (name[0].isupper() and name.lower() not in _NAMES_TOO):
        return True
    return word_before in _DATE_PREPOSITIONS or bool(_NOTHING_AFTER.match(text, m.end()))


def _date_term(mention: DateMention) -> str:
    # One term per date, so a date weighs in BM25 as one word does: that day exactly when its
    # year is written (2022-11-09, "9 November, 2022"), else that day of any year.
    day = _day_term(mention.month, mention.day)
    term = f"{mention.year}{day}" if mention.year is not None else day
    if mention.exact:
        return term
    # "Nov" as indexed: november; a Russian name stays as written (its stem is the index's).
    name = mention.name if mention.name.lower() in MONTHS_RU else MONTHS_EN[mention.month - 1]
    return f"{name} {term}"


def dates_as_terms(text: str) -> str:
    """A text's dates as the terms `date_words` indexes a turn's own date under: a day beside a
    month's name ("9 November", "Nov 9th", «9 ноября») becomes that day of the year (any year)
    beside the month's name, or that day exactly when a year follows ("9 November, 2022"; the
    year stays as written); an ISO date that day exactly. Applied alike to
    questions and to what turns say, so "due on Nov 9" matches "November 9th"; any other number
    stays a number, which no turn's date matches."""
    out, at = [], 0
    for mention in date_mentions(text):
        glued = text[mention.end:mention.end + 1].isalnum()  # 2022-11-09T10:00: the time stays a word of its own
        out += [text[at:mention.start], _date_term(mention) + " " * glued]
        at = mention.end
    return "".join(out) + text[at:] if out else text


def phrase(text: str) -> str:
    """A text (an identifier such as `MT-4471`) as the stems it is indexed under: `mt 4471`."""
    return index_text(text)
