"""Paraphrase retrieval for the embedder choice, in seed 000's method, Russian and English twins.

Six-turn work chats, one fact each, among chatter that names the same sites and equipment, so
a question must match a combination. Questions paraphrase the fact (synonyms: «отбраковка» →
«брак», «взял на себя» → «ответственный») and inflect it (other cases and word order). Every
Russian fact has an English twin with the same slots, so one run gives English → English,
Russian → Russian and Russian question → English passage. Deterministic for (n, seed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# (nominative, locative phrase); the locative is what facts and questions use.
SITES_RU = [("Северная площадка", "на Северной площадке"), ("Южный склад", "на Южном складе"),
            ("Речной терминал", "на Речном терминале"), ("Восточный цех", "в Восточном цехе"),
            ("Горный участок", "на Горном участке"), ("Западная база", "на Западной базе"),
            ("Портовый склад", "на Портовом складе"), ("Лесная площадка", "на Лесной площадке")]
SITES_EN = ["at the North site", "at the South warehouse", "at the River terminal", "in the East workshop",
            "at the Mountain section", "at the West base", "at the Port warehouse", "at the Forest site"]
# nominative, genitive, dative, accusative, instrumental
EQUIP_RU = [("компрессор", "компрессора", "компрессору", "компрессор", "компрессором"),
            ("насос", "насоса", "насосу", "насос", "насосом"),
            ("конвейер", "конвейера", "конвейеру", "конвейер", "конвейером"),
            ("пресс", "пресса", "прессу", "пресс", "прессом"),
            ("котёл", "котла", "котлу", "котёл", "котлом"),
            ("смеситель", "смесителя", "смесителю", "смеситель", "смесителем")]
EQUIP_EN = ["compressor", "pump", "conveyor", "press", "boiler", "mixer"]
PEOPLE_RU = ["Игорь", "Марина", "Олег", "Светлана", "Дмитрий", "Анна", "Павел", "Елена"]
PEOPLE_EN = ["Igor", "Marina", "Oleg", "Svetlana", "Dmitry", "Anna", "Pavel", "Elena"]

# (Russian fact, Russian question, English fact, English question); slots: s = site, e = equipment
# forms (ru: e0..e4 cases, en: e), p = person.
TEMPLATES = [
    ("По итогам проверки {p} взял на себя отбраковку запчастей для {e1} {s}.",
     "Кто ответственный за брак запасных частей {e1} {s}?",
     "After the check {p} took on rejecting the spare parts for the {e} {s}.",
     "Who is responsible for defective replacement parts of the {e} {s}?"),
    ("{S} решили перенести ремонт {e1} на следующую неделю из-за задержки поставки.",
     "Почему отложили починку {e1} {s}?",
     "{S} we decided to move the {e} repair to next week because the delivery is late.",
     "Why was fixing the {e} {s} postponed?"),
    ("Смазку {e1} {s} теперь делаем раз в две недели, график утвердил {p}.",
     "Как часто теперь смазывают {e3} {s}?",
     "Lubrication of the {e} {s} is now every two weeks, {p} approved the schedule.",
     "How often is the {e} {s} greased now?"),
    ("{S} {e0} перегревается после обеда, датчик температуры показывает 95 градусов.",
     "Что с перегревом {e1} {s}?",
     "{S} the {e} overheats after lunch, the temperature sensor reads 95 degrees.",
     "What is wrong with the {e} {s} running too hot?"),
    ("Заказ уплотнений для {e1} {s} отправили поставщику, ждём к пятнице.",
     "Когда придут уплотнители к {e2} {s}?",
     "The order of seals for the {e} {s} went to the supplier, we expect it by Friday.",
     "When will the gaskets for the {e} {s} arrive?"),
    ("{S} {e0} будем менять на новый, старый списываем.",
     "Что решили делать со старым {e4} {s}?",
     "{S} we will replace the {e} with a new one and write off the old one.",
     "What was decided about the old {e} {s}?"),
    ("Калибровку датчиков {e1} {s} проведёт {p} в четверг.",
     "Кто и когда откалибрует сенсоры {e1} {s}?",
     "{p} will calibrate the sensors of the {e} {s} on Thursday.",
     "Who is going to recalibrate the {e} gauges {s}, and when?"),
    ("{S} у {e1} проскальзывает ремень, нужна замена.",
     "Что случилось с приводным ремнём {e1} {s}?",
     "{S} the belt of the {e} is slipping and needs replacing.",
     "What happened to the drive belt of the {e} {s}?"),
    ("{S} {e0} сильно вибрирует, сигнализация срабатывает каждые полчаса.",
     "Почему всё время звенит тревога по вибрации {e1} {s}?",
     "{S} the {e} vibrates badly, the alarm goes off every half hour.",
     "Why does the shaking alert of the {e} {s} keep ringing?"),
]
CHATTER_RU = ["Доброе утро, {s} сегодня спокойно, {e0} работает нормально.",
              "Привет! Вижу {e3} {s} на общей панели. Что нужно?",
              "Спасибо. Напомни потом проверить {e3} {s}.",
              "Хорошо. Что-нибудь ещё {s} на сегодня?"]
CHATTER_EN = ["Morning. Quiet day {s}, the {e} runs fine.",
              "Hi! I can see the {e} {s} on the shared board. What do you need?",
              "Thanks. Remind me later to check the {e} {s}.",
              "Sure. Anything else {s} today?"]


@dataclass(frozen=True)
class ParaphraseSet:
    passages_ru: list[str]
    passages_en: list[str]
    questions_ru: list[str]
    questions_en: list[str]
    answer: list[int]  # index of the fact passage for question i, the same in both languages


def _ru(template: str, site: tuple[str, str], equip: tuple[str, ...], person: str) -> str:
    loc = site[1]
    return template.format(s=loc, S=loc[0].upper() + loc[1:], p=person, **{f"e{i}": f for i, f in enumerate(equip)})


def _en(template: str, site: str, equip: str, person: str) -> str:
    return template.format(s=site, S=site[0].upper() + site[1:] + ",", e=equip, p=person)


def generate(n: int, seed: int = 11) -> ParaphraseSet:
    rng = random.Random(seed)
    combos = [(t, s, e) for t in range(len(TEMPLATES)) for s in range(len(SITES_RU)) for e in range(len(EQUIP_RU))]
    rng.shuffle(combos)
    ru, en, q_ru, q_en, answer = [], [], [], [], []
    for t, s, e in combos[:n]:
        person = rng.randrange(len(PEOPLE_RU))
        other_s, other_e = rng.randrange(len(SITES_RU)), rng.randrange(len(EQUIP_RU))
        fact_ru, question_ru, fact_en, question_en = TEMPLATES[t]
        for i, chat in enumerate(CHATTER_RU):
            ru.append(_ru(chat, SITES_RU[other_s if i % 2 else s], EQUIP_RU[other_e if i < 2 else e], ""))
            en.append(_en(CHATTER_EN[i], SITES_EN[other_s if i % 2 else s], EQUIP_EN[other_e if i < 2 else e], ""))
        answer.append(len(ru))
        ru.append(_ru(fact_ru, SITES_RU[s], EQUIP_RU[e], PEOPLE_RU[person]))
        en.append(_en(fact_en, SITES_EN[s], EQUIP_EN[e], PEOPLE_EN[person]))
        q_ru.append(_ru(question_ru, SITES_RU[s], EQUIP_RU[e], ""))
        q_en.append(_en(question_en, SITES_EN[s], EQUIP_EN[e], ""))
    return ParaphraseSet(ru, en, q_ru, q_en, answer)
