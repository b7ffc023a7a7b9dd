"""Time words in a query ("last week", "in October", "on 9 November", "2026-10-08", "a week ago",
"last Friday", "over the weekend", "in early October", "between Oct 5 and Oct 10", "on Monday or Tuesday", "on 11/03"
in the order of the user's country; in Russian «на прошлой неделе», «в октябре», «9 ноября», «три дня назад», «в пятницу») become a soft
preference for passages from that window. Semantic search is poor at temporal questions, and a
hard filter loses answers when the user's memory of the date is off, so in-window passages are
moved first and the rest still fill the remaining places. Resolved in the caller's time zone
(`time_zones.py`; UTC by default): "yesterday" is the user's yesterday, from their midnight.
"""

from __future__ import annotations

import calendar
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import NamedTuple

from services.recall.time_zones import month_first
from shared.engine.text_analysis import MONTHS_RU, STOP_WORDS, DateMention, date_mentions, stem, words

MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}, sept=9)
# Russian month names «в ноябре» (prepositional); the genitive of «9 ноября» is MONTHS_RU.
MONTHS_RU_IN = {name: i + 1 for i, name in enumerate(
    "январе феврале марте апреле мае июне июле августе сентябре октябре ноябре декабре".split())}
_UNITS = {"day": 1, "days": 1, "week": 7, "weeks": 7, "fortnight": 14, "fortnights": 14, "month": 30, "months": 30,
          "year": 365, "years": 365}
# Every form a count takes: «1 день», «2 дня», «5 дней», «неделю», «недели», «недель», «месяц»…
_UNITS_RU = {"день": 1, "дня": 1, "дней": 1, "неделю": 7, "недели": 7, "недель": 7, "неделя": 7,
             "месяц": 30, "месяца": 30, "месяцев": 30, "год": 365, "года": 365, "лет": 365}
# A count in words ("a week ago", "the last two weeks", «три дня назад», «пару недель назад»): a
# few, several and «несколько» are about three.
_COUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
           "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "couple of": 2, "a few": 3, "few": 3,
           "several": 3}
_COUNTS_RU = {"один": 1, "одну": 1, "два": 2, "две": 2, "три": 3, "четыре": 4, "пять": 5, "шесть": 6, "семь": 7,
              "восемь": 8, "девять": 9, "десять": 10, "пару": 2, "несколько": 3}
_WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}  # monday 0
# «в понедельник», «во вторник», «в среду»…: the accusative a day takes after «в».
_WEEKDAYS_RU = {"понедельник": 0, "вторник": 1, "среду": 2, "четверг": 3, "пятницу": 4, "субботу": 5, "воскресенье": 6}


@dataclass(frozen=True)
class TimeWindow:
    start: datetime
    end: datetime  # exclusive
    latest: bool = False  # no time named ("last time"): the whole memory, its latest conversations first

    def contains(self, when: datetime) -> bool:
        return self.start <= when < self.end


# Every date the calendar can hold a day inside of, in any time zone.
LATEST = TimeWindow(datetime(1, 1, 2, tzinfo=timezone.utc), datetime(9999, 12, 30, tzinfo=timezone.utc), latest=True)


# Words that ask about the conversations themselves, not about a topic in them: "what did we
# discuss last week" names a time and nothing else (English and Russian, stemmed below).
_CONVERSATION_WORDS = (
    "discuss discussed discussion talk talked say said tell told chat chatted mention mentioned happen happened "
    "do did done decide decided cover covered conversation conversations topic topics ask asked work worked "
    "remind recall earlier before previously "
    # About which or how many conversations, not a topic: "what else did we discuss last month", "list all
    # conversations from last week", «покажи все разговоры за прошлую неделю». "show" and "list" only as a
# request that opens the question (`_SHOW`): "the show we watched", "the shopping list" are topics.
    "else other others all every everything anything ещё еще все всё остальное другое список разговоров "
    "обсуждали обсуждать обсуждение говорили говорить сказали сказал разговаривали разговор разговоры "
    "было делали решили тема темы спрашивал спрашивала напомни напомнить ранее раньше"
)
# What is left of a question made of time words alone ("yesterday", "last 7 days": it is searched
# as given) or naming an ISO date, which stays in the searched text.
_TIME_WORDS = ["yesterday", "today", "tonight", "last", "past", "this", "year", "years", "ago", "since", *_UNITS, *MONTHS,
               "weekend", "morning", "afternoon", "evening", "night", "выходные", "выходных", "утром", "днём", "днем",
               "вечером", "ночью",
               "вчера", "сегодня", "позавчера", "назад", "последние", "прошлой", "прошлом", "этой", "этом", "неделе",
               "месяце", "году", "года", "прошлого", "го", "е", "sept", *_UNITS_RU, *MONTHS_RU, *MONTHS_RU_IN]
_CONVERSATION_STEMS = frozenset(stem(w) for w in [*_CONVERSATION_WORDS.split(), *_TIME_WORDS])
_ABOUT_CONVERSATIONS = frozenset(stem(w) for w in _CONVERSATION_WORDS.split()) - frozenset(stem(w) for w in STOP_WORDS)


_SHOW = re.compile(r"^\W*(?:(?:please|can\s+you|could\s+you)\s+)?(?:show|list|покажи|перечисли)(?:\s+(?:me|мне))?(?!\w)",
                   re.IGNORECASE)


def names_only_a_time(searched: str, named_a_window: bool = True) -> bool:
    """Whether a question, its time words removed (`find_time_window`'s searched text), asks about
    nothing but the conversations of that time: the floor would refuse it (it shares no word
    with them), and what it wants is what was said then. Time words still in it (a date, kept for
    BM25; a query of nothing else, searched as given) are no topic; any other number is
    ("1069.5 yesterday" asks for 1069.5). When the query named no window (`named_a_window`
    false: "this Friday" before Friday comes), its time words are a topic, searched as text,
    as `find_time_window` leaves them: stripped here, "what did we discuss this Friday" was
    answered with the latest conversations."""
    unresolved: set[str] = set()
    for rule in _PATTERNS:
        while found := rule.find(searched):
            if not named_a_window:
                unresolved |= {stem(w) for w in words(searched[found.start:found.end]) if w not in STOP_WORDS}
            searched = f"{searched[:found.start]} {searched[found.end:]}"
    searched = _SHOW.sub(" ", searched)
    asked = {stem(w) for w in words(searched) if w not in STOP_WORDS}
    return not asked - _CONVERSATION_STEMS and not unresolved - _ABOUT_CONVERSATIONS


def asked_conversations(searched: str, window: TimeWindow | None) -> TimeWindow | None:
    """The time whose conversations answer a question that asks for conversations, not a topic
    (`names_only_a_time`): the one it names, or the latest conversations for "last time" or for
    words about the conversations alone ("what did we discuss", "remind me"); None for a
    question with a topic, which is searched."""
    if not names_only_a_time(searched, window is not None):
        return None
    if window is not None:
        return window
    return LATEST if {stem(w) for w in words(searched)} & _ABOUT_CONVERSATIONS else None


# A request to the assistant ("remind me about the Riga hotel", «напомни про отель в Риге») and
# the verbs of saying ("what did I say about the migration", "did we discuss Sintra last week")
# name no topic. Searched, «напомни» ranked first a turn that said it («Напомни бабушкин рецепт
# борща»), "says" a dentist's turn over the migration chat, and "discuss" made an unrelated turn
# of last week a match for that week. "remind" alone is a topic word ("what did Maria make to
# remind her of England"): only the request. Taken off LoCoMo-dev's questions (32 of 762 hold
# such a verb), R@3 / R@5 / R@8 moved 0.788 / 0.850 / 0.892 → 0.788 / 0.848 / 0.892, own text
# 0.631 / 0.711 / 0.777 → 0.631 / 0.714 / 0.780 (docs/benchmarks.md, round 31).
_SAYING = ("say said says tell told ask asked discuss discussed talk talked mention mentioned "
           "говорил говорила говорили сказал сказала сказали спрашивал спрашивала спрашивали обсуждал обсуждала "
           "обсуждали упоминал упоминала упоминали рассказывал рассказывала рассказывали")
_REQUEST = re.compile(r"\b(?:remind\s+me|напомн(?:и|ите)(?:\s+мне)?|" + "|".join(_SAYING.split()) + r")(?!\w)",
                      re.IGNORECASE)


def without_request(searched: str) -> str:
    """`searched` without its request words and verbs of saying when a topic is left; as it is
    otherwise (a question of such words alone asks for the latest conversations: `asked_conversations`)."""
    rest = " ".join(_REQUEST.sub(" ", searched).split())
    # Called for a question with a topic; a time word left in it named no window (or a second
    # one), and is searched as text.
    return rest if rest and not names_only_a_time(rest, named_a_window=False) else searched


def _day(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)


def _month(year: int, month: int) -> TimeWindow:
    start = datetime(year, month, 1, tzinfo=timezone.utc)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=timezone.utc)
    return TimeWindow(start, end)


class _Found(NamedTuple):
    """Where a rule found its time words, and what its resolver reads."""

    start: int
    end: int
    what: re.Match | tuple[DateMention, int | None]


class _Rule(NamedTuple):
    """Where a rule finds its words, and how it reads them: `resolve(what, today)`, or with `clock`
    `resolve(what, today, local)`, `local` the user's wall clock (its hour and zone: "last night" at
    00:30, "11/3" in a country writing the month first); `strip` drops the words from the searched query."""

    find: Callable[[str], _Found | None]
    resolve: Callable
    strip: bool
    clock: bool = False


_PATTERNS: list[_Rule] = []


def _rule(pattern: str, strip: bool = True, clock: bool = False):
    """Register a resolver (`_Rule`)."""
    compiled = re.compile(pattern, re.IGNORECASE)

    def find(query: str) -> _Found | None:
        m = compiled.search(query)
        return _Found(m.start(), m.end(), m) if m else None

    def register(fn):
        _PATTERNS.append(_Rule(find, fn, strip, clock))
        return fn
    return register


# How many years back "last year" / "this year" (прошлого / этого года) go.
_YEARS_BACK = {"last": 1, "this": 0, "прошлого": 1, "этого": 0}


def _years_back(word: str) -> int:
    """casefold, not lower: IGNORECASE also matched "laſt" (a long s), which lower() keeps."""
    return _YEARS_BACK[word.casefold()]

# After a day without its year: "9 November last year", «9 ноября прошлого года».
_YEAR_WORDS = re.compile(r",?\s+(?:(last|this)\s+year|(прошлого|этого)\s+года)(?!\w)", re.IGNORECASE)
# The year a mention read after the day ("2 мая 2025", "May 2, 2025"), which its span leaves out.
_YEAR_WRITTEN = re.compile(r",?\s+\d{4}\b")


# A date that names a place: «улица 1 Мая», «проспект 9 января», "Calle 5 de Mayo" is no day.
_PLACE_BEFORE = re.compile(r"(?:улиц[аеуы]|ул\.|проспект\w*|просп\.|пр-т|площад[ьи]|пл\.|переул\w*|пер\.|бульвар\w*"
                           r"|набережн\w*|станци[яиюей]|метро|street|avenue|square|calle|rue)\s*$", re.IGNORECASE)


def _dates(query: str) -> list[DateMention]:
    """The engine's date mentions in a query, but for those naming a place."""
    return [m for m in date_mentions(query) if not _PLACE_BEFORE.search(query, max(0, m.start - 20), m.start)]


def _first_date(query: str) -> _Found | None:
    """An ISO date or a day beside a month's name, read by the engine's own date grammar
    (text_analysis.date_mentions): kept in the searched text, where BM25 matches it as the day.
    What it reads is the mention and, for words naming its year, how many years back (0 or 1)."""
    mentions = _dates(query)
    if not mentions:
        return None
    first = mentions[0]
    if first.year is not None:
        written = _YEAR_WRITTEN.match(query, first.end)
        return _Found(first.start, written.end() if written else first.end, (first, None))
    named = _YEAR_WORDS.match(query, first.end)
    back = None if named is None else _years_back(named[1] or named[2])
    return _Found(first.start, named.end() if named else first.end, (first, back))


def _named_day(found: tuple[DateMention, int | None], today: date) -> TimeWindow | None:
    """That day; without a year, last year's or this year's as words after it say, else its last
    one (not yet come this year means last year's)."""
    mention, back = found
    year = (mention.year if mention.year is not None else today.year - back if back is not None
            else _last_year_of(mention.month, today, mention.day))
    try:
        d = date(year, mention.month, mention.day)
    except ValueError:  # "30 February", year 0
        return None
    return TimeWindow(_day(d), _day(d) + timedelta(days=1))


# A span of days: "between Oct 5 and Oct 10", "from 5 to 10 October", "Oct 5-10", «с 5 по 10
# октября», «с 5 октября по 3 ноября», «между 5 и 10 октября». One side may be a bare day of the other's month.
_SPAN_WORD = r"\s*(?:and|to|through|thru|until|till|-|–|—|по|до|и)\s*(?:the\s+)?"
_SPAN_OPEN = re.compile(r"(?:\b(?:between|from)|(?<!\w)(?:с|между))\s+(?:the\s+)?$", re.IGNORECASE)
_BARE_DAY = r"(\d{1,2})(?:st|nd|rd|th|-?го|-?е)?"
_SPAN_AFTER = re.compile(_SPAN_WORD + _BARE_DAY + r"(?![\w.,:/-]?\d)(?!\s+(?:" + "|".join(_MONTH_NUMBERS_WORDS := sorted(
    {*MONTHS, *MONTHS_RU}, key=len, reverse=True)) + r"))", re.IGNORECASE)
_SPAN_BEFORE = re.compile(r"(?:\b(?:between|from)|(?<!\w)(?:с|между))\s+(?:the\s+)?" + _BARE_DAY + _SPAN_WORD + r"$", re.IGNORECASE)


def _date_span(query: str) -> _Found | None:
    """Two dates joined as a span, or a date and a bare day of its month; its year as the
    end's (`_named_day`), the start a year earlier when it would come after the end."""
    mentions = _dates(query)
    for i, first in enumerate(mentions):
        before = _SPAN_OPEN.search(query, max(0, first.start - 20), first.start)
        joined = re.compile(_SPAN_WORD, re.IGNORECASE).match(query, first.end)
        if before and joined and i + 1 < len(mentions) and mentions[i + 1].start == joined.end():
            last = mentions[i + 1]
            return _Found(before.start(), _year_end(query, last), (first.month, first.day, first.year, last))
        bare = _SPAN_AFTER.match(query, first.end)
        if bare and not before and not query.startswith(("-", "–"), first.end):  # "Oct 5-10" needs no "from"
            bare = None
        if bare and int(bare[1]) >= first.day:
            last = first._replace(day=int(bare[1]), end=bare.end())
            start = before.start() if before else first.start
            return _Found(start, _year_end(query, last), (first.month, first.day, first.year, last))
        opened = _SPAN_BEFORE.search(query, max(0, first.start - 40), first.start)
        if opened and int(opened[1]) <= first.day:
            return _Found(opened.start(), _year_end(query, first), (first.month, int(opened[1]), first.year, first))
    return None


def _year_end(query: str, last: DateMention) -> int:
    """Where a span ends: its last date, with the year written after it (which a mention's span leaves out)."""
    written = _YEAR_WRITTEN.match(query, last.end)
    return written.end() if written else last.end


def _named_span(found: tuple[int, int, int | None, DateMention], today: date) -> TimeWindow | None:
    month, day, year, last = found
    end = _named_day((last, None), today)
    if end is None:
        return None
    try:
        start = date(year if year is not None else end.start.year, month, day)
    except ValueError:
        return None
    if year is None and _day(start) >= end.end:
        start = start.replace(year=start.year - 1)
    return TimeWindow(_day(start), end.end) if _day(start) < end.end else None


_PATTERNS.append(_Rule(_date_span, _named_span, False))

# "the week of October 5", "in the week of Oct 5th": that date's calendar week (from Monday). Taken
# out of the searched text: the day's term would put that one day's passages first.
_WEEK_OF = re.compile(r"(?:\b(?:in|during|over)\s+)?\bthe\s+week\s+of\s+(?:the\s+)?$", re.IGNORECASE)


def _week_of(query: str) -> _Found | None:
    for mention in _dates(query):
        before = _WEEK_OF.search(query, max(0, mention.start - 30), mention.start)
        if before:
            return _Found(before.start(), _year_end(query, mention), (mention, None))
    return None


def _week_of_window(found: tuple[DateMention, int | None], today: date) -> TimeWindow | None:
    day = _named_day(found, today)
    if day is None:
        return None
    monday = day.start - timedelta(days=day.start.weekday())
    return TimeWindow(monday, monday + timedelta(days=7))


_PATTERNS.insert(_PATTERNS.index(_Rule(_date_span, _named_span, False)), _Rule(_week_of, _week_of_window, True))


# Days given as alternatives: "Oct 6 or Oct 8", "Oct 6 or 8", «5 или 7 ноября», "6 and 8 October". The
# window is one span, so it is the span covering them (Oct 6 to Oct 8, the 7th with them): it only
# reorders, and a day between is nearer the user's memory than any other. Kept in the searched text.
_EITHER_WORD = r"\s*,?\s*(?:or|and|или|либо|и)\s+(?:on\s+)?(?:the\s+)?"
_EITHER_JOIN = re.compile(_EITHER_WORD, re.IGNORECASE)
_EITHER_BARE_AFTER = re.compile(r"\s*,?\s*(?:or|или|либо)\s+(?:the\s+)?" + _BARE_DAY + r"(?![\w.,:/-]?\d)(?!\s+(?:"
                                + "|".join(_MONTH_NUMBERS_WORDS) + r"))(?!\s*%)", re.IGNORECASE)
_EITHER_BARE_BEFORE = re.compile(r"(?<![\w.,/:+-])" + _BARE_DAY + _EITHER_WORD + r"$", re.IGNORECASE)


def _date_either(query: str) -> _Found | None:
    """Two dates, or a date and a bare day of its month, joined by "or" / "and" (no "between")."""
    mentions = _dates(query)
    for i, first in enumerate(mentions):
        joined = _EITHER_JOIN.match(query, _year_end(query, first))
        if joined and i + 1 < len(mentions) and mentions[i + 1].start == joined.end():
            return _Found(first.start, _year_end(query, mentions[i + 1]), (first, mentions[i + 1]))
        bare = _EITHER_BARE_AFTER.match(query, first.end)
        if bare and 1 <= int(bare[1]) <= 31:
            last = first._replace(day=int(bare[1]), end=bare.end())
            return _Found(first.start, _year_end(query, last), (first, last))
        before = _EITHER_BARE_BEFORE.search(query, max(0, first.start - 30), first.start)
        if before and 1 <= int(before[1]) <= 31:
            return _Found(before.start(), _year_end(query, first), (first._replace(day=int(before[1])), first))
    return None


def _either_window(found: tuple[DateMention, DateMention], today: date) -> TimeWindow | None:
    """The shorter of the spans from one day to the other: "Oct 8 or Oct 6" is Oct 6 to 8, not a year
    from Oct 8; "Dec 30 or Jan 2" crosses the new year."""
    first, last = found
    spans = [w for w in (_named_span((first.month, first.day, first.year, last), today),
                         _named_span((last.month, last.day, last.year, first), today)) if w is not None]
    return min(spans, key=lambda w: w.end - w.start, default=None)


_PATTERNS.append(_Rule(_date_either, _either_window, False))
_PATTERNS.append(_Rule(_first_date, _named_day, False))


# A numeric date with its year: "25.10.2026" (day first, as every country writing dots does),
# "2026/10/25", and "25/10/2026", "10/25/2026" or "3/11/26"; where both numbers can be the month
# ("10/11/2026"), the user's zone decides (`_day_and_month`). Taken out of the searched text: BM25
# reads its numbers as three bare numbers, which match any turn's "10".
_NUMERIC_DATE = re.compile(r"(?<![\w.,/:+-])(?:(\d{1,2})\.(\d{1,2})\.(\d{4})|(\d{4})/(\d{1,2})/(\d{1,2})"
                           r"|(\d{1,2})/(\d{1,2})/(\d{4}|\d{2}))(?![\w.,/:-]?\d)")


def _day_and_month(first: int, second: int, local: datetime) -> tuple[int, int] | None:
    """The day and month of a slashed date: the number that cannot be a month is the day; else the
    order of the user's country (its time zone: month first in the United States, "11/3" is 3
    November; day first in most of the world, 11 March); none in a zone of no country (UTC, the
    default) or of one writing both (Canada): searched as text."""
    if first == second or first > 12 >= second:
        return first, second
    if second > 12 >= first:
        return second, first
    order = month_first(local.tzinfo)
    if order is None:
        return None
    return (second, first) if order else (first, second)


def _two_digit_year(year: int, today: date) -> int:
    """"3/11/26" is 2026; a year past this one is last century's ("4/5/98")."""
    return 2000 + year if 2000 + year <= today.year else 1900 + year


@_rule(r"\b(?:on\s+)?" + _NUMERIC_DATE.pattern, clock=True)
def _numeric_date(m: re.Match, today: date, local: datetime) -> TimeWindow | None:
    if m[1]:
        day, month, year = int(m[1]), int(m[2]), int(m[3])
    elif m[4]:
        year, month, day = int(m[4]), int(m[5]), int(m[6])
    else:
        year = int(m[9]) if len(m[9]) == 4 else _two_digit_year(int(m[9]), today)
        if (read := _day_and_month(int(m[7]), int(m[8]), local)) is None:
            return None
        day, month = read
    d = date(year, month, day)  # ValueError for "31.02.2026": no window, searched as text
    return TimeWindow(_day(d), _day(d) + timedelta(days=1))


# A slashed day without its year, "on 11/03", "since 3/11": its last one, the order as above. Only
# after "on" or "since" and before the question's end or its words: bare, "1/2", "3/4 of", "16/9"
# are fractions and ratios, "24/7" round the clock, "v1/2" a version, and "on 1/2 cup" a measure.
@_rule(r"\b(?:on|since)\s+(?<![\w.,/:+-])(?!24/7\b)(\d{1,2})/(\d{1,2})(?![\w.,/:%-]|\s*%)"
       r"(?=\s*$|\s*[,.?!;]|\s+(?:we|i|you|about|regarding|with|and|or|at|in|the|to|for|morning|afternoon|evening"
       r"|night)\b)", clock=True)
def _short_numeric_date(m: re.Match, today: date, local: datetime) -> TimeWindow | None:
    if (read := _day_and_month(int(m[1]), int(m[2]), local)) is None or not 1 <= read[1] <= 12:
        return None
    day, month = read
    d = date(_last_year_of(month, today, day), month, day)  # ValueError for "on 31/02": searched as text
    return TimeWindow(_day(d), _day(d) + timedelta(days=1))


# A Russian numeric day without its year, the everyday «03.11» / «3.11» (day first): its last one,
# as «3 ноября». Only in a query with Cyrillic letters ("Python 3.11" is a version), with the month
# in two digits («ставка 6.5» is a rate), never before a percent sign («под 6.5%»), after a word of
# the clock («в 10.05», «к 9.30») or of a version («версии 1.12», «Python 3.11»), and kept in the
# searched text (a number that is no date is still searched).
_DAY_MONTH_RU = re.compile(r"(?<![\w.,/:+-])(?<!\bв\s)(?<!\bк\s)(?<!\bдо\s)(?<!\bот\s)(\d{1,2})\.(\d{2})"
                           r"(?![\w,/:%-]|\.\d|\s*%)", re.IGNORECASE)
_VERSION_BEFORE = re.compile(r"(?:верси\w*|релиз\w*|release|version|ver|v|python|java|node|go|php|ruby|rust|"
                             r"postgres\w*|ubuntu|debian|ios|android|macos|windows)\.?\s*$", re.IGNORECASE)
_CYRILLIC = re.compile(r"[а-яё]", re.IGNORECASE)


def _day_month_ru(query: str) -> _Found | None:
    if not _CYRILLIC.search(query):
        return None
    for m in _DAY_MONTH_RU.finditer(query):
        if not _VERSION_BEFORE.search(query, max(0, m.start() - 20), m.start()):
            return _Found(m.start(), m.end(), m)
    return None


def _day_month_ru_window(m: re.Match, today: date) -> TimeWindow | None:
    day, month = int(m[1]), int(m[2])
    if not 1 <= month <= 12:
        return None
    d = date(_last_year_of(month, today, day), month, day)  # ValueError for «31.02»: searched as text
    return TimeWindow(_day(d), _day(d) + timedelta(days=1))


_PATTERNS.append(_Rule(_day_month_ru, _day_month_ru_window, False))


# "on the 3rd": the 3rd of this month, or of last month before it comes; not "on the 3rd floor"
# (only before the question's end, a comma or words of the question).
@_rule(r"\bon\s+the\s+(\d{1,2})(?:st|nd|rd|th)(?:\s+of\s+(this|last)\s+month)?"
       r"(?=\s*$|\s*[,.?!;]|\s+(?:we|i|you|about|regarding|with|and|or)\b)")
def _day_of_month(m: re.Match, today: date) -> TimeWindow | None:
    day = int(m[1])
    year, month = today.year, today.month
    back = m[2] and m[2].casefold() == "last"
    if back or (not m[2] and day > today.day):
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    if not back and not m[2] and day > calendar.monthrange(year, month)[1]:  # "the 31st" after a 30-day month
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    d = date(year, month, day)  # ValueError for "the 31st of last month" in a shorter one: searched as text
    return TimeWindow(_day(d), _day(d) + timedelta(days=1))


# A day as a Russian ordinal word: «третьего ноября», «двадцать пятого ноября прошлого года». Kept in
# the searched text (its month is a word BM25 matches in the turns' dates).
_ORDINALS_RU = {"первого": 1, "второго": 2, "третьего": 3, "четвёртого": 4, "четвертого": 4, "пятого": 5, "шестого": 6,
                "седьмого": 7, "восьмого": 8, "девятого": 9, "десятого": 10, "одиннадцатого": 11, "двенадцатого": 12,
                "тринадцатого": 13, "четырнадцатого": 14, "пятнадцатого": 15, "шестнадцатого": 16, "семнадцатого": 17,
                "восемнадцатого": 18, "девятнадцатого": 19, "двадцатого": 20, "тридцатого": 30}


@_rule(r"(?<!\w)(?:(двадцать|тридцать)\s+)?(" + "|".join(sorted(_ORDINALS_RU, key=len, reverse=True)) + r")\s+("
       + "|".join(MONTHS_RU) + r")(?:\s+(\d{4})(?:\s+(?:года|г\.?))?|\s+(прошлого|этого)\s+года)?(?!\w)", strip=False)
def _ordinal_day_ru(m: re.Match, today: date) -> TimeWindow | None:
    ones = _ORDINALS_RU[m[2].lower()]
    if m[1] and ones > 9:  # «двадцать двадцатого» is no day
        return None
    day, month = ones + (20 if m[1] and m[1].lower() == "двадцать" else 30 if m[1] else 0), MONTHS_RU.index(m[3].lower()) + 1
    year = int(m[4]) if m[4] else today.year - _years_back(m[5]) if m[5] else _last_year_of(month, today, day)
    d = date(year, month, day)  # ValueError for «тридцать первого февраля»: searched as text
    return TimeWindow(_day(d), _day(d) + timedelta(days=1))


def _last_year_of(month: int, today: date, day: int = 1) -> int:
    """The year of the most recent such month (or day of it): one not yet come this year means last year's."""
    return today.year if (month, day) <= (today.month, today.day) else today.year - 1


def _days_back(today: date, days: int) -> TimeWindow:
    """The day `days` before today, alone."""
    return TimeWindow(_day(today) - timedelta(days=days), _day(today) - timedelta(days=days - 1))


def _alternatives(names) -> str:
    """A regex alternation of `names`, longest first ("a few" before "a"), any spaces between words."""
    return "|".join(re.escape(n).replace(r"\ ", r"\s+") for n in sorted(names, key=len, reverse=True))


_COUNT = r"(\d{1,3}|" + _alternatives(_COUNTS) + ")"
_COUNT_RU = r"(\d{1,3}|" + _alternatives(_COUNTS_RU) + ")"


def _count(text: str) -> int:
    """Digits, or a count in words (casefold: IGNORECASE also matches "ſeven")."""
    return int(text) if text.isdigit() else {**_COUNTS, **_COUNTS_RU}[" ".join(text.casefold().split())]


def _up_to_today(today: date, days: int) -> TimeWindow:
    """The last `days` days and today ("past 7 days", «за последние 7 дней»)."""
    return TimeWindow(_day(today) - timedelta(days=days), _day(today) + timedelta(days=1))


def _calendar(today: date, unit: str, this: bool) -> TimeWindow:
    """This or the previous calendar week (from Monday) or month; this one runs to today (was to
    the month's end: "earlier this month" showed "from 2026-12-01 to 2026-12-31")."""
    if unit == "week":
        monday = _day(today) - timedelta(days=today.weekday())
        return TimeWindow(monday, _day(today) + timedelta(days=1)) if this else TimeWindow(monday - timedelta(days=7), monday)
    if this:
        return TimeWindow(_month(today.year, today.month).start, _day(today) + timedelta(days=1))
    year, month = (today.year - 1, 12) if today.month == 1 else (today.year, today.month - 1)
    return _month(year, month)


def _around(today: date, days: int) -> TimeWindow:
    """About `days` ago: that day, give or take a day per week ("3 weeks ago" is approximate;
    "two days ago" is that day, and with a day's slack its conversations came after yesterday's)."""
    center = _day(today) - timedelta(days=days)
    slack = timedelta(days=days // 7)
    return TimeWindow(center - slack, min(center + slack, _day(today)) + timedelta(days=1))  # never past today


# A part of the day goes with its day ("yesterday evening", «вчера вечером»): left in the searched
# text it was a topic, and "what did I say yesterday evening" searched "evening". The window
# stays the whole day (chats run past a part's edges; the window only reorders).
_PART_OF_DAY = r"(?:\s+(?:morning|afternoon|evening|night|at\s+lunch(?:time)?|at\s+noon|over\s+lunch))?"
_PART_OF_DAY_RU = r"(?:\s+(?:утром|днём|днем|вечером|ночью|в\s+обед|с\s+утра))?"
# The same before its day: "at lunch yesterday", «в обед вчера».
_PART_BEFORE = r"(?:(?:at\s+lunch(?:time)?|at\s+noon|over\s+lunch)\s+)?"
_PART_BEFORE_RU = r"(?:(?:в\s+обед|с\s+утра)\s+)?"


# "the day before yesterday evening", «позавчера вечером»: a part of the day goes with it (was searched).
@_rule(r"\b(?:the\s+)?day\s+before\s+yesterday" + _PART_OF_DAY + r"\b|\bпозавчера" + _PART_OF_DAY_RU + r"(?!\w)")
def _day_before_yesterday(m: re.Match, today: date) -> TimeWindow:
    return _days_back(today, 2)


# Before this hour the night is not over: asked at 00:30, "last night" is the evening before and
# the hour just gone (its chats' turns are dated today), not yesterday alone.
_NIGHT_ENDS = 5


# "last night", "yesterday evening", "tonight", «вчера вечером», «вчера ночью», «сегодня ночью»: asked
# from midnight to 05:00 (the user's clock), yesterday and today; later, their day as any part of it.
@_rule(r"\b(?:on\s+)?yesterday\s+(?:evening|night)\b|\blast\s+night\b|\btonight\b"
       r"|\bвчера\s+(?:вечером|ночью)(?!\w)|\bсегодня\s+ночью(?!\w)", clock=True)
def _night(m: re.Match, today: date, local: datetime) -> TimeWindow:
    if local.hour < _NIGHT_ENDS:
        return TimeWindow(_day(today) - timedelta(days=1), _day(today) + timedelta(days=1))
    return _days_back(today, 0 if m[0].casefold().startswith(("tonight", "сегодня")) else 1)


@_rule(r"\b" + _PART_BEFORE + r"(?:on\s+|earlier\s+)?today" + _PART_OF_DAY + r"\b|\b(?:this\s+(?:morning|afternoon|evening)|tonight)\b"
       r"|(?<!\w)" + _PART_BEFORE_RU + r"сегодня" + _PART_OF_DAY_RU + r"(?!\w)")
def _today(m: re.Match, today: date) -> TimeWindow:
    return _days_back(today, 0)


@_rule(r"\b" + _PART_BEFORE + r"(?:on\s+)?yesterday" + _PART_OF_DAY + r"\b|\blast\s+night\b|(?<!\w)" + _PART_BEFORE_RU + r"вчера"
       + _PART_OF_DAY_RU + r"(?!\w)")
def _yesterday(m: re.Match, today: date) -> TimeWindow:
    return _days_back(today, 1)


# "last time", "the previous conversation", «в прошлый раз», "the last thing we talked about", "the
# most recent conversation", «последнее, что мы обсуждали»: no time, the latest conversations.
@_rule(r"\b(?:last|previous)\s+(?:time|conversation|chat|session)\b|\bв\s+(?:прошлый|последний)\s+раз\b"
       r"|\bпрошл(?:ый|ом)\s+разговор[еа]?\b|\b(?:the\s+)?(?:very\s+)?(?:last|latest|most\s+recent)\s+(?:thing|things"
       r"|conversations?|chats?|sessions?|topics?)\b|(?<!\w)(?:самое\s+)?последн(?:ее|ий\s+разговор|яя\s+тема)"
       r"(?=\s*,?\s*(?:что|о\s+чём|о\s+чем)\b|\s*$|\s*[?.!])")
def _last_time(m: re.Match, today: date) -> TimeWindow:
    return LATEST


# "recently", "lately", "the other day", «недавно», «на днях»: the last two weeks.
@_rule(r"\b(?:recently|lately|the\s+other\s+day)\b|\bнедавно\b|\bна\s+днях\b")
def _recently(m: re.Match, today: date) -> TimeWindow:
    return _up_to_today(today, 14)


# Part of a month: "in early October", "mid-October", "at the end of September 2025", "late last
# month", «в начале октября», «в конце прошлого месяца». Thirds of the month (first half: 1-15).
_PARTS = {"early": (1, 10), "beginning": (1, 10), "start": (1, 10), "mid": (11, 20), "middle": (11, 20),
          "late": (21, 31), "end": (21, 31), "first half": (1, 15), "second half": (16, 31),
          "начале": (1, 10), "середине": (11, 20), "конце": (21, 31), "первой половине": (1, 15),
          "второй половине": (16, 31), "first week": (1, 7), "second week": (8, 14), "third week": (15, 21),
          "fourth week": (22, 28), "last week": (-7, 31), "первую неделю": (1, 7), "вторую неделю": (8, 14),
          "третью неделю": (15, 21), "четвёртую неделю": (22, 28), "четвертую неделю": (22, 28),
          "последнюю неделю": (-7, 31), "первой неделе": (1, 7), "второй неделе": (8, 14), "третьей неделе": (15, 21),
          "последней неделе": (-7, 31)}
# (first, last) days; a negative first counts from the month's end: "the last week of October" is its last 7 days.
_PART_EN = (r"(early|mid|late|(?:the\s+)?(?:beginning|start|middle|end|first\s+half|second\s+half"
            r"|(?:first|second|third|fourth|last)\s+week)\s+of)[\s-]+(?:the\s+month\s+of\s+)?")
_PART_RU = (r"(?:в|на)\s+(начале|середине|конце|первой\s+половине|второй\s+половине|(?:первую|вторую|третью|четв[её]ртую"
            r"|последнюю)\s+неделю|(?:первой|второй|третьей|последней)\s+неделе)\s+")
_GENITIVE_MONTHS = "|".join(sorted(MONTHS_RU, key=len, reverse=True))


@_rule(r"\b(?:(?:in|at|during|by|since)\s+)?(?:the\s+)?" + _PART_EN + r"(?:(" + "|".join(sorted(MONTHS, key=len, reverse=True))
       + r")\.?(?:\s+(\d{4}))?|(this|last)\s+month)\b"
       r"|\b" + _PART_RU + r"(?:(" + _GENITIVE_MONTHS + r")(?:\s+(\d{4})(?:\s+(?:года|г\.?))?)?|(этого|прошлого)\s+месяца)(?!\w)")
def _part_of_month(m: re.Match, today: date) -> TimeWindow:
    if m[1]:
        part, name, year_text, which = m[1], m[2], m[3], m[4]
        if name and name.lower() in ("may", "march", "mar") and not name[0].isupper():
            return None  # "we leave early, may we", "the end of march 3 miles": a verb
        month = MONTHS[name.lower()] if name else None
    else:
        part, name, year_text, which = m[5], m[6], m[7], m[8]
        month = MONTHS_RU.index(name.lower()) + 1 if name else None
    part = " ".join(part.casefold().split()).removeprefix("the ").removesuffix(" of")
    first, last = _PARTS[part.casefold()]
    if month is None:  # this or last month
        this = which.casefold() in ("this", "этого")
        whole = _month(today.year, today.month) if this else _calendar(today, "month", this=False)
    else:
        whole = _month(int(year_text) if year_text else _last_year_of(month, today, max(first, 1)), month)
    start = whole.end + timedelta(days=first) if first < 0 else whole.start + timedelta(days=first - 1)
    return TimeWindow(start, min(whole.end, whole.start + timedelta(days=last)))


# Part of a week: "earlier in the week" (this week, to today); "at the start / in the middle / at the end
# of the week" (this week's), "of last week", «в начале / середине / конце (прошлой) недели»: Monday to
# Wednesday, Tuesday to Thursday, Thursday to Sunday (weeks from Monday). Before "last week", which it holds.
_WEEK_PARTS = {"start": (0, 3), "beginning": (0, 3), "middle": (1, 4), "end": (3, 7), "начале": (0, 3),
               "середине": (1, 4), "конце": (3, 7)}


@_rule(r"\bearlier\s+in\s+the\s+week\b|\b(?:at|in|by|towards?)\s+the\s+(start|beginning|middle|end)\s+of\s+(the|this|last)"
       r"\s+week\b|\bв\s+(начале|середине|конце)\s+(?:(этой|прошлой)\s+)?недели(?!\w)")
def _part_of_week(m: re.Match, today: date) -> TimeWindow:
    part, which = m[1] or m[3], m[2] or m[4]
    if part is None:  # "earlier in the week"
        return _calendar(today, "week", this=True)
    first, last = _WEEK_PARTS[part.casefold()]
    monday = _calendar(today, "week", this=which is None or which.casefold() in ("the", "this", "этой")).start
    return TimeWindow(monday + timedelta(days=first), monday + timedelta(days=last))


@_rule(r"\b(this|last|past|previous)\s+(week|month)(?:['’]s)?\b")  # "last week's meeting": "'s" was searched
def _this_last(m: re.Match, today: date) -> TimeWindow:
    which, unit = m[1].lower(), m[2].lower()
    if which == "past":  # the days up to today, as "past 7 days" ("last week" is the calendar one)
        return _up_to_today(today, _UNITS[unit])
    return _calendar(today, unit, this=which == "this")


# «на прошлой неделе», «в этом месяце», «за прошлую неделю», «за этот месяц».
@_rule(r"\b(?:на|в)\s+(этой|прошлой)\s+неделе\b|\b(?:в)\s+(этом|прошлом)\s+месяце\b"
       r"|\bза\s+(эту|прошлую)\s+неделю\b|\bза\s+(этот|прошлый)\s+месяц\b")
def _this_last_ru(m: re.Match, today: date) -> TimeWindow:
    which = (m[1] or m[2] or m[3] or m[4]).lower()
    return _calendar(today, "week" if m[1] or m[3] else "month", this=which.startswith("эт"))


# "the week before last", «на позапрошлой неделе»: the calendar week two back (from Monday).
@_rule(r"\b(?:(?:in|during|over)\s+)?the\s+week\s+before\s+last\b|\b(?:на|в)\s+позапрошлой\s+неделе\b"
       r"|\bза\s+позапрошлую\s+неделю\b")
def _week_before_last(m: re.Match, today: date) -> TimeWindow:
    last = _calendar(today, "week", this=False)
    return TimeWindow(last.start - timedelta(days=7), last.start)


@_rule(r"\b(?:(?:in|over|during)\s+)?(?:the\s+)?(?:last|past)\s+" + _COUNT + r"\s+(days?|weeks?|fortnights?|months?|years?)\b")
def _last_n(m: re.Match, today: date) -> TimeWindow:
    return _up_to_today(today, _count(m[1]) * _UNITS[m[2].lower()])


_UNIT_NAMES_RU = "|".join(sorted(_UNITS_RU, key=len, reverse=True))


# «за последние 7 дней», «за последние три дня», «за последнюю неделю», «за последний месяц»
# («цена за 5 дней аренды», «отчёт за неделю» name no time).
@_rule(r"\bза\s+последн(?:ие\s+" + _COUNT_RU + r"\s+(" + _UNIT_NAMES_RU + r")|(?:юю|ий)\s+(неделю|месяц|день|год))\b")
def _last_n_ru(m: re.Match, today: date) -> TimeWindow:
    return _up_to_today(today, _count(m[1]) * _UNITS_RU[m[2].lower()] if m[1] else _UNITS_RU[m[3].lower()])


# "half a year ago", «полгода назад»: about six months (182 days) ago; "a year ago" was read in the first.
@_rule(r"\bhalf\s+a\s+year\s+ago\b|(?<!\w)(?:пол\s*года|полгода)\s+назад(?!\w)")
def _half_a_year_ago(m: re.Match, today: date) -> TimeWindow:
    return _around(today, 182)


@_rule(r"\b" + _COUNT + r"\s+(days?|weeks?|fortnights?|months?|years?)\s+ago\b")
def _ago(m: re.Match, today: date) -> TimeWindow:
    return _around(today, _count(m[1]) * _UNITS[m[2].lower()])


# "an hour ago", "a few minutes ago", "5 hours ago", «час назад», «пару часов назад», «несколько минут
# назад»: resolvers get only the user's date, not the time of day, so today and yesterday (an hour
# ago at 00:30 is yesterday evening); from a day of hours on, that many days back to today.
_HOURS_RU = "час|часа|часов|полчаса|минуту|минуты|минут|секунд|секунду"


@_rule(r"\b(?:" + _COUNT + r"|half\s+an)\s+(hours?|minutes?|mins?|seconds?)\s+ago\b"
       r"|(?<!\w)(?:" + _COUNT_RU + r"\s+)?(" + _HOURS_RU + r")\s+назад(?!\w)")
def _hours_ago(m: re.Match, today: date) -> TimeWindow:
    count = _count(m[1]) if m[1] else _count(m[3]) if m[3] else 1
    hours = count if (m[2] or m[4]).casefold().startswith(("hour", "час")) else 0
    return TimeWindow(_day(today) - timedelta(days=max(1, -(-hours // 24))), _day(today) + timedelta(days=1))


# «3 дня назад», «три дня назад», «пару недель назад», «неделю назад», «год назад».
@_rule(r"\b(?:" + _COUNT_RU + r"\s+(" + _UNIT_NAMES_RU + r")|(день|неделю|месяц|год))\s+назад\b")
def _ago_ru(m: re.Match, today: date) -> TimeWindow:
    return _around(today, _count(m[1]) * _UNITS_RU[m[2].lower()] if m[1] else _UNITS_RU[m[3].lower()])


_MONTH_NAMES = "|".join(sorted(MONTHS, key=len, reverse=True))


# "in October", "during May", "since May" (to today), or "October 2026": a bare month word ("may we…") is no date.
@_rule(r"\b(?:(?:in|during|since)\s+(" + _MONTH_NAMES + r")(?:\s+(\d{4})|\s+(last|this)\s+year)?|(" + _MONTH_NAMES
       + r")\s+(\d{4}))\b")
def _named_month(m: re.Match, today: date) -> TimeWindow:
    name, year_text = (m[1], m[2]) if m[1] else (m[4], m[5])
    month = MONTHS[name.lower()]
    if m[3]:  # "in November last year", "in May this year"
        return _month(today.year - _years_back(m[3]), month)
    return _month(int(year_text) if year_text else _last_year_of(month, today), month)


_MONTH_NAMES_RU = "|".join(sorted(MONTHS_RU_IN, key=len, reverse=True))


# «в ноябре», «в мае 2025 года», «в ноябре прошлого года»
@_rule(r"\bв\s+(" + _MONTH_NAMES_RU + r")(?:\s+(\d{4})(?:\s+(?:года|г\.?))?|\s+(прошлого|этого)\s+года)?(?!\w)")
def _named_month_ru(m: re.Match, today: date) -> TimeWindow:
    month = MONTHS_RU_IN[m[1].lower()]
    if m[3]:
        return _month(today.year - _years_back(m[3]), month)
    return _month(int(m[2]) if m[2] else _last_year_of(month, today), month)


def _weekday(today: date, weekday: int, this: bool) -> TimeWindow:
    """"on Friday", "last Friday": the latest one before today (one to seven days back); "this
    Friday": this week's (from Monday), which may be still to come (`_until_today`: a time not
    yet come names no window)."""
    back = today.weekday() - weekday if this else (today.weekday() - weekday - 1) % 7 + 1
    return _days_back(today, back)


def _weekdays(today: date, weekdays: list[int], this: bool) -> TimeWindow:
    """One weekday, or the span covering alternatives ("on Monday or Tuesday"); of "this Monday or
    Friday" asked on a Wednesday, those come (Monday); all still to come, the first of them."""
    days = [_weekday(today, weekday, this) for weekday in weekdays]
    come = [d for d in days if d.start <= _day(today)] or days[:1]
    return TimeWindow(min(d.start for d in come), max(d.end for d in come))


_WEEKDAY_NAMES = "|".join(_WEEKDAYS)


# "on Monday", "last Friday", "since Tuesday", "on Wednesday evening" (a part of the day goes with
# its day, as after "yesterday"); a bare weekday ("the Monday standup") is a topic, and "monday.com" no day.
# "on Monday or Tuesday", "last Monday and Tuesday": the span covering them (`_weekdays`).
@_rule(r"\b(on|last|this\s+past|this|past|previous|since)\s+(" + _WEEKDAY_NAMES + r")(?:\b(?!\.\w)" + _PART_OF_DAY
       + r")?(?:\s*,?\s*(?:or|and)\s+(?:on\s+)?(" + _WEEKDAY_NAMES + r")(?:\b(?!\.\w)" + _PART_OF_DAY + r")?)?\b(?!\.\w)")
def _named_weekday(m: re.Match, today: date) -> TimeWindow:
    named = [_WEEKDAYS[m[2].casefold()], *([_WEEKDAYS[m[3].casefold()]] if m[3] else [])]
    return _weekdays(today, named, this=m[1].casefold() == "this")  # "this past Friday" is the last one


_WEEKDAY_NAMES_RU = "|".join(_WEEKDAYS_RU)


# «в пятницу», «во вторник», «в прошлую среду», «в эту пятницу», «в среду вечером».
# «в понедельник или вторник», «в понедельник или во вторник»: the span covering them; «на эту пятницу»
# (what was planned for it) as «в эту пятницу».
@_rule(r"\b(?:в[о]?|на(?=\s+эт))\s+(?:(прошл(?:ый|ую|ое)|эт(?:от|у|о))\s+)?(" + _WEEKDAY_NAMES_RU + r")" + _PART_OF_DAY_RU
       + r"(?:\s*,?\s*(?:или|либо|и)\s+(?:в[о]?\s+)?(" + _WEEKDAY_NAMES_RU + r")" + _PART_OF_DAY_RU + r")?(?!\w)")
def _named_weekday_ru(m: re.Match, today: date) -> TimeWindow:
    named = [_WEEKDAYS_RU[m[2].lower()], *([_WEEKDAYS_RU[m[3].lower()]] if m[3] else [])]
    return _weekdays(today, named, this=bool(m[1]) and m[1].lower().startswith("эт"))


def _weekend(today: date, which: str) -> TimeWindow:
    """Saturday and Sunday: "last weekend" the previous week's (weeks from Monday), "this weekend"
    this week's (before its Saturday still to come: `_until_today`), "the weekend" the latest one begun."""
    monday = _day(today) - timedelta(days=today.weekday())
    if which == "this" or (which == "the" and today.weekday() >= 5):
        return TimeWindow(monday + timedelta(days=5), monday + timedelta(days=7))
    return TimeWindow(monday - timedelta(days=2), monday)


_WEEKEND_WHICH = {"last": "last", "past": "last", "this past": "last", "previous": "last", "this": "this", "прошлые": "last",
                  "прошлых": "last", "эти": "this", "этих": "this"}


# "over the weekend", "last weekend", "this weekend", «на выходных», «в прошлые выходные», «на этих выходных».
# «в выходные» as «на выходных»; "the weekend before last", «на позапрошлых выходных»: two back.
@_rule(r"\b(?:(?:over|on|at|during)\s+)?the\s+weekend\s+before\s+last\b|\b(?:на\s+позапрошлых\s+выходных"
       r"|в\s+позапрошлые\s+выходные)(?!\w)"
       r"|\b(?:over|on|at|during)\s+the\s+weekend\b|\b(last|past|previous|this\s+past|this)\s+weekend\b"
       r"|\bна\s+(?:(прошлых|этих)\s+)?выходных(?!\w)|\bв\s+(?:(прошлые|эти)\s+)?выходные(?!\w)")
def _named_weekend(m: re.Match, today: date) -> TimeWindow:
    if m[0].casefold().endswith(("before last", "позапрошлых выходных", "позапрошлые выходные")):
        last = _weekend(today, "last")
        return TimeWindow(last.start - timedelta(days=7), last.end - timedelta(days=7))
    which = m[1] or m[2] or m[3]
    return _weekend(today, _WEEKEND_WHICH[" ".join(which.casefold().split())] if which else "the")


# «с понедельника», «со вторника», «с прошлой пятницы»: since that day.
_WEEKDAYS_RU_SINCE = {"понедельника": 0, "вторника": 1, "среды": 2, "четверга": 3, "пятницы": 4, "субботы": 5,
                      "воскресенья": 6}


@_rule(r"\bс[о]?\s+(?:прошл(?:ого|ой)\s+)?(" + "|".join(_WEEKDAYS_RU_SINCE) + r")(?!\w)")
def _since_weekday_ru(m: re.Match, today: date) -> TimeWindow | None:
    day = _weekday(today, _WEEKDAYS_RU_SINCE[m[1].lower()], this=False)
    return day and _since(day, today)


# Seasons, northern hemisphere's meteorological ones: winter December to February, spring March
# to May, summer June to August, autumn (fall) September to November.
_SEASONS = {"winter": 12, "spring": 3, "summer": 6, "autumn": 9, "fall": 9, "зимой": 12, "весной": 3, "летом": 6,
            "осенью": 9}


def _season(today: date, first_month: int, last: bool, year: int | None = None) -> TimeWindow:
    """The season beginning in `first_month`: of `year` (winter 2025: December 2025 to February
    2026), else the latest begun (the current one runs to today: `_until_today`), or with `last`
    the latest over ("last winter" in December is the one before)."""
    def bounds(year: int) -> TimeWindow:
        after = first_month + 3  # the month after its last, maybe in the next year
        return TimeWindow(_day(date(year, first_month, 1)), _day(date(year + (after > 12), (after - 1) % 12 + 1, 1)))

    if year is not None:
        return bounds(year)
    latest = bounds(today.year if today.month >= first_month else today.year - 1)
    return bounds(latest.start.year - 1) if last and latest.end > _day(today) else latest


# "in the summer", "during the winter of 2025", "the summer of 2025", "summer 2025", "in the summer
# last year", "last winter", "this spring", "in the fall" (a bare season word is a topic: "spring
# cleaning", "the fall of Rome"; "in Spring Boot" is a framework), «летом», «прошлой зимой», «этой
# осенью», «прошлым летом», «летом прошлого года», «летом 2025 года».
_SEASON_YEAR = r"(?:\s+(?:of\s+)?(?P<year>\d{4})|\s+(?P<which_year>last|this)\s+year)?"
_SEASON_YEAR_RU = r"(?:\s+(?P<year_ru>\d{4})(?:\s+(?:года|г\.?))?|\s+(?P<which_year_ru>прошлого|этого)\s+года)?"


@_rule(r"\b(?:(?:in|during|over|through)\s+(?:the\s+)?|(?P<which>last|this|past|previous)\s+|(?:the\s+)?(?=\w+\s+(?:of\s+)?\d{4}\b))"
       r"(?P<name>winter|spring|summer|autumn|fall)" + _SEASON_YEAR
       + r"\b(?!\s+(?:boot|framework|cloud|security|mvc|batch|data|integration|shell)\b)(?![.\w])"
       r"|(?<!\w)(?:(?P<which_ru>прошл(?:ой|ым)|эт(?:ой|им))\s+)?(?P<name_ru>зимой|весной|летом|осенью)" + _SEASON_YEAR_RU + r"(?!\w)")
def _named_season(m: re.Match, today: date) -> TimeWindow | None:
    first_month = _SEASONS[(m["name"] or m["name_ru"]).casefold()]
    year, which_year = m["year"] or m["year_ru"], m["which_year"] or m["which_year_ru"]
    if year:
        return _season(today, first_month, False, int(year))
    if which_year:  # the season that began in that year ("the summer last year")
        return _season(today, first_month, False, today.year - _years_back(which_year))
    which = m["which"] or m["which_ru"]
    return _season(today, first_month, last=bool(which) and which.casefold().startswith(("last", "past", "previous", "прошл")))


def _year(today: date, this: bool) -> TimeWindow:
    """This calendar year (to today) or the previous one."""
    if this:
        return TimeWindow(_day(date(today.year, 1, 1)), _day(today) + timedelta(days=1))
    return TimeWindow(_day(date(today.year - 1, 1, 1)), _day(date(today.year, 1, 1)))


# Registered after the day and month rules, which read "9 November last year" and "in May this year" whole.
@_rule(r"\b(this|last|past|previous)\s+year\b")
def _this_last_year(m: re.Match, today: date) -> TimeWindow:
    which = m[1].casefold()
    return _up_to_today(today, 365) if which == "past" else _year(today, this=which == "this")


# «в этом году», «в прошлом году»
@_rule(r"\bв\s+(этом|прошлом)\s+году(?!\w)")
def _this_last_year_ru(m: re.Match, today: date) -> TimeWindow:
    return _year(today, this=m[1].lower() == "этом")


# "since <a time>", and in Russian «с <a date>» («с 25 ноября»: since; a span «с 5 по 10 октября» and
# «с понедельника» are rules of their own, which begin at «с»).
_SINCE = re.compile(r"(?:\bsince|(?<!\w)со?)\s+$", re.IGNORECASE)


def _since(window: TimeWindow, today: date) -> TimeWindow:
    """"since <a time>": from the start of that time up to today."""
    return TimeWindow(window.start, max(window.end, _day(today) + timedelta(days=1)))


def _until_today(window: TimeWindow, today: date) -> TimeWindow | None:
    """A window no later than today: no conversation is from a day to come, and the answer's
    note names the window ("late this month", "in December" on 4 December: to the 4th). One that
    has not begun yet names no time (None: its words are searched as text)."""
    if window.start > _day(today):
        return None
    if today < date.max and window.end > _day(today) + timedelta(days=1):
        return dataclasses.replace(window, end=_day(today) + timedelta(days=1))
    return window


class TimeReading(NamedTuple):
    """What `read_time` found: the query without its time words, the window they name, and, when
    they name none, the first time they named that is still to come ("this Friday" on a Wednesday)."""

    searched: str
    window: TimeWindow | None
    upcoming: TimeWindow | None = None


def find_time_window(query: str, now: datetime, zone: tzinfo = timezone.utc) -> tuple[str, TimeWindow | None]:
    """The query without its time words, and the window they name (`read_time`)."""
    searched, window, _ = read_time(query, now, zone)
    return searched, window


def read_time(query: str, now: datetime, zone: tzinfo = timezone.utc) -> TimeReading:
    """The query without its time words, and the window they name (the first one found), in
    `zone`'s days: the rules build it from the date there as midnights in UTC, which are then
    taken as that zone's midnights (its wall clock, so a day of a DST change is 23 or 25 hours).
    A time still to come names no window (its words stay a topic) but is kept as `upcoming`, so
    the answer can say so: passages about "this Friday" asked on a Wednesday are from other days."""
    try:
        local = now.astimezone(zone)
    except OverflowError:  # 0001-01-01 00:00 UTC is still year 0 in New York: read in UTC's day
        local = now.astimezone(timezone.utc)
    today = local.date()
    upcoming = None
    for find, resolve, strip, clock in _PATTERNS:
        found = find(query)
        if found:
            since = _SINCE.search(query, 0, found.start)
            begin = since.start() if since else found.start
            try:
                window = resolve(found.what, today, local) if clock else resolve(found.what, today)  # None for a date no calendar has ("2026-02-30")
                if window is not None and not window.latest and (
                        since or query[found.start:found.end].lower().startswith("since")):
                    window = _since(window, today)
                if window is not None and not window.latest:
                    if upcoming is None and window.start > _day(today):
                        upcoming = _in_zone(window, zone)
                    window = _until_today(window, today)
            except (OverflowError, ValueError, KeyError):
                # A date at the calendar's edge ("9999-12-31", "March 0000") has no window
                # datetime can hold, and a letter IGNORECASE folds ("in ſeptember") names no
                # month of the table: the words are still searched as text, never an error.
                window = None
            if window is not None:
                rest = " ".join((query[:begin] + " " + query[found.end:]).split()).strip(" ,") if strip else query
                # Nothing left: search with the words as given.
                return TimeReading(rest or query, window if window.latest else _in_zone(window, zone))
    return TimeReading(query, None, upcoming)


def _in_zone(window: TimeWindow, zone: tzinfo) -> TimeWindow:
    """A window the rules built as UTC midnights, as the same wall-clock midnights in `zone`."""
    return dataclasses.replace(window, start=window.start.replace(tzinfo=zone), end=window.end.replace(tzinfo=zone))
