"""The Russian twin of bench/corpus.py: the same method, Russian work chats.

N six-message conversations, each hiding one fact among chatter; sites, equipment (units such as
`Н-012`) and twelve people recur. Questions never repeat the fact's wording: they paraphrase
and inflect it (other cases and word order, synonyms: «брак» / «отбраковка», «взялась» /
«ответственный», «течь сальника» / «подтекающий сальник»). Forms as in English: short (unit +
inflected key noun), long (a paraphrased question with the unit), bare (no unit; only where
kind + site + detail name one conversation). A hit = a returned passage holding the answer
and the unit. Deterministic for a given (n, seed).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from bench.corpus import Conversation, Question, with_bare_forms

# (nominative, genitive, prepositional, dative) of each city
SITES = [
    ("Казань", "Казани", "Казани", "Казани"), ("Самара", "Самары", "Самаре", "Самаре"),
    ("Тула", "Тулы", "Туле", "Туле"), ("Пермь", "Перми", "Перми", "Перми"),
    ("Омск", "Омска", "Омске", "Омску"), ("Томск", "Томска", "Томске", "Томску"),
    ("Уфа", "Уфы", "Уфе", "Уфе"), ("Курск", "Курска", "Курске", "Курску"),
    ("Липецк", "Липецка", "Липецке", "Липецку"), ("Тверь", "Твери", "Твери", "Твери"),
    ("Вологда", "Вологды", "Вологде", "Вологде"), ("Калуга", "Калуги", "Калуге", "Калуге"),
]
# (name, feminine)
PEOPLE = [("Ольга", True), ("Игорь", False), ("Марина", True), ("Сергей", False), ("Наталья", True),
          ("Дмитрий", False), ("Елена", True), ("Павел", False), ("Анна", True), ("Михаил", False),
          ("Татьяна", True), ("Алексей", False)]
# (nominative, genitive, prepositional, dative, instrumental, unit letter)
KINDS = [
    ("насос", "насоса", "насосе", "насосу", "насосом", "Н"),
    ("компрессор", "компрессора", "компрессоре", "компрессору", "компрессором", "К"),
    ("конвейер", "конвейера", "конвейере", "конвейеру", "конвейером", "Т"),
    ("пресс", "пресса", "прессе", "прессу", "прессом", "П"),
    ("котёл", "котла", "котле", "котлу", "котлом", "Б"),
    ("смеситель", "смесителя", "смесителе", "смесителю", "смесителем", "С"),
]
# (what the chat says, in the nominative; after «по», dative; how a question paraphrases it;
#  the short query's inflected key noun)
SYMPTOMS = [
    ("течь сальника", "течи сальника", "подтекающий сальник", "течью"),
    ("срабатывает сигнал вибрации", "сигналу вибрации", "постоянные тревоги из-за вибраций", "вибрацией"),
    ("шум в подшипнике", "шуму в подшипнике", "скрежет подшипников", "подшипники"),
    ("перегрев двигателя", "перегреву двигателя", "двигатель, который сильно греется", "перегревом"),
    ("падение давления", "падению давления", "снижение давления", "давлением"),
    ("проскальзывание ремня", "проскальзыванию ремня", "ремень, который буксует", "ремнём"),
]
# (what the fact says after «за», accusative; how a question paraphrases it, genitive; short key)
TASKS = [
    ("квартальную калибровку", "плановой поверки датчиков", "калибровке"),
    ("обход по смазке", "графика смазывания", "смазкой"),
    ("проверку по технике безопасности", "осмотра по охране труда", "безопасностью"),
    ("заказ запчастей", "закупки запасных частей", "запчастями"),
]
OPTIONS = ["отремонтировать на месте", "заменить на новый", "эксплуатировать до отказа", "перевести в резерв",
           "модернизировать систему управления"]
WEEKDAYS = ["понедельник", "вторник", "среду", "четверг", "пятницу"]


def generate(n: int, seed: int = 7, now: datetime | None = None) -> tuple[list[Conversation], list[Question]]:
    rng = random.Random(seed)
    now = now or datetime(2026, 11, 1, tzinfo=timezone.utc)
    n_units = max(4, n // 4)
    units = [(KINDS[i % len(KINDS)], 1 + i // len(KINDS)) for i in range(n_units)]
    names = [f"{kind[5]}-{num:03d}" for kind, num in units]
    conversations: list[Conversation] = []
    questions: list[Question] = []
    keys: list[tuple] = []
    bare: list[str] = []
    tickets = rng.sample(range(10000, 99999), n)
    for i in range(n):
        cid = f"conv-{i:05d}"
        u = i % n_units
        kind, unit = units[u][0], names[u]
        nom, gen, prep, dat, ins = kind[:5]
        site = SITES[(u * 5 + i // n_units) % len(SITES)]
        other = [names[rng.randrange(n_units)] for _ in range(2)]
        other_site = SITES[rng.randrange(len(SITES))]
        person, feminine = PEOPLE[rng.randrange(len(PEOPLE))]
        took = "взялась" if feminine else "взялся"
        fact_type = (i // n_units) % 4
        if fact_type == 0:
            sym = SYMPTOMS[rng.randrange(len(SYMPTOMS))]
            answer = f"ЗН-{tickets[i]}"
            ask = f"{nom.capitalize()} {unit} в {site[2]} опять: {sym[0]}."
            fact = f"Завёл заявку {answer} по {sym[1]} на {prep} {unit}; {person} {took} за неё."
            long_q = f"Под каким номером завели заявку про {sym[2]} у {gen} {unit}?"
            short_q = f"{unit} заявка с {sym[3]}"
            bare_q = f"Какой номер у заявки про {sym[2]} у {gen} из {site[1]}, за которую {took} {person}?"
            detail = (sym, person)
        elif fact_type == 1:
            rate = f"{rng.randrange(1, 99) / 10:.1f}%".replace(".", ",")
            answer = rate
            ask = f"Занеси, пожалуйста, проверку ОТК по {dat} {unit} в {site[2]}."
            fact = f"Записал: проверка ОТК на {prep} {unit} показала брак {rate} в этой партии."
            long_q = f"Какой процент отбраковки вышел при контроле качества {gen} {unit}?"
            short_q = f"{unit} процентом брака"
            bare_q = f"Какой процент отбраковки вышел при контроле качества {gen} из {site[1]}?"
            detail = None
        elif fact_type == 2:
            task = TASKS[rng.randrange(len(TASKS))]
            day = WEEKDAYS[rng.randrange(len(WEEKDAYS))]
            answer = person
            ask = f"Кто возьмёт {task[0]} по {dat} {unit} в {site[2]}?"
            fact = f"{person} {took} за {task[0]} {gen} {unit}, срок — {day}."
            long_q = f"Кто у нас ответственный за проведение {task[1]} для {gen} {unit}?"
            short_q = f"{unit} ответственного за {task[2]}"
            bare_q = f"Кто ответственный за проведение {task[1]} для {gen} из {site[1]} со сроком в {day}?"
            detail = (task, day)
        else:
            option = OPTIONS[rng.randrange(len(OPTIONS))]
            answer = f"РШ-{i:05d}"
            approved = "согласовала" if feminine else "согласовал"
            ask = f"Нужно решение по старому {dat} {unit} в {site[2]}."
            fact = f"Решение {answer}: {option} {nom} {unit}, {approved} {person}."
            long_q = f"Что в итоге решили со старым {ins} {unit} и какой номер у решения?"
            short_q = f"{unit} решению"
            bare_q = f"Что решили со старым {ins} из {site[1]}, что {approved} {person}, и какой номер у решения?"
            detail = person
        messages = [
            f"Доброе утро. В {other_site[2]} завал; {other[0]} пока работает нормально.",
            f"Доброе! Вижу {other[1]} на табло {other_site[1]} тоже. Что нужно?",
            ask,
            fact,
            f"Спасибо. Напомни потом проверить ещё {other[0]}.",
            f"Хорошо. Что-нибудь ещё по {site[3]} сегодня?",
        ]
        started = now - timedelta(days=rng.uniform(1, 365), minutes=rng.randrange(600))
        conversations.append(Conversation(cid, started, messages))
        questions.append(Question(short_q, long_q, answer, unit, cid))
        keys.append((fact_type, nom, site[0], detail))
        bare.append(bare_q)
    return conversations, with_bare_forms(questions, keys, bare)
