"""The evaluation corpora. The Debian FAQ (Debian's `debian-faq` package, installed by scripts/eval): one document per
question, the question itself kept out of the text so that a search must find the answer, not the heading. The
PostgreSQL 15 manual (Debian's `postgresql-doc-15`): 70 of its HTML pages ingested as HTML, with questions written
for them (pgdocs_set.py) whose gold is the chunk holding the answering sentence. Plus the questions every corpus is
asked (off-domain) and two small paraphrase sets."""
import dataclasses
import gzip
import html as markup
import re

FAQ = "/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz"
MANUAL = "/usr/share/doc/postgresql-doc-15/html"


@dataclasses.dataclass
class Document:
    key: str
    title: str
    body: str
    format: str = "text"


@dataclasses.dataclass
class Question:
    text: str
    key: str  # the document that answers it
    phrase: str | None = None  # words of the answering sentence; None: any chunk of the document answers
    kind: str = "plain"
    parts: tuple | None = None  # the phrase's halves, when the chunker cut it in two

    def held_by(self, content: str) -> bool:
        """Whether a chunk of the answering document (its text with whitespace collapsed) holds the answer."""
        if self.phrase is None or self.phrase in content:
            return True
        return self.parts is not None and any(part in content for part in self.parts)


@dataclasses.dataclass
class Corpus:
    name: str
    collection: str
    description: str
    gold: str
    documents: list
    questions: list
    unanswerable: list

# Questions whose answers are not in the FAQ at all: every one must be refused.
OFF_DOMAIN = [
    "What is the boiling point of water at sea level?",
    "Who painted the Mona Lisa?",
    "How do I bake sourdough bread at home?",
    "What is the capital city of Australia?",
    "How many players are on a football team?",
    "What causes the seasons on Earth?",
    "How do I change a flat tyre on a bicycle?",
    "Which vitamins are found in oranges?",
    "When did the Roman Empire fall?",
    "How long should I boil an egg?",
    "What is the best way to learn to play the guitar?",
    "How do vaccines train the immune system?",
    "What is the tallest mountain in Africa?",
    "How do I negotiate a higher salary?",
    "What is the plot of Hamlet?",
    "How much water should a houseplant get each week?",
    "Who won the first FIFA World Cup?",
    "How do I remove a red wine stain from a carpet?",
    "What is the speed of light in a vacuum?",
    "How do bees make honey?",
]

# About Debian, but not answered by the FAQ.
IN_DOMAIN_UNANSWERABLE = [
    "How many people attended DebConf in 2019?",
    "What is the name of the Debian project leader elected in 2024?",
    "How much RAM does the Debian 12 graphical installer need?",
    "Which Debian mirror is the fastest in Brazil?",
    "What was the exact release date of Debian 12.4?",
    "How many packages did Debian 12 ship on release day?",
    "Who designed the Debian swirl logo?",
    "What is the default wallpaper of Debian 12 called?",
    "How many architectures does Debian 13 support?",
    "Which CPU is fastest for building Debian packages?",
]


# A small handbook whose questions are worded unlike the passages that answer them (few shared words): the case
# where one distance ceiling refuses legitimate questions. (title, passage, question)
HANDBOOK = [
    ("Leave", "Employees receive twenty-five days of paid vacation every year. Unused days may be carried over until March.",
     "How many holidays do I get?"),
    ("Resignation", "Anyone who wants to quit must tell their manager in writing one month in advance.",
     "How much notice do I have to give before leaving the company?"),
    ("Expenses", "Train tickets and hotel bills for business trips are refunded within two weeks.",
     "Will I get my travel costs back?"),
    ("Parking", "Staff may leave their cars in the garage behind the building free of charge.",
     "Where can I put my car while I am at work?"),
    ("Payroll", "Salaries are paid on the last working day of each month by bank transfer.",
     "When do we get our wages?"),
    ("Remote work", "Team members may work from home up to three days a week after agreeing it with their lead.",
     "Am I allowed to do my job from my flat?"),
    ("Sick days", "If you are ill, call your supervisor before nine o'clock and send a doctor's note after three days.",
     "What should I do when I wake up with a fever and cannot come in?"),
    ("Equipment", "Laptops and phones issued by the IT desk remain company property and must be returned on the last day.",
     "Can I keep my work computer when my contract ends?"),
    ("Training", "Each employee has a budget of 1,500 euros a year for courses and conferences related to their role.",
     "How much money can I spend on learning new skills?"),
    ("Working hours", "The core hours are ten to four; the rest of the eight-hour day can be arranged flexibly.",
     "Do I have to be at my desk at eight in the morning?"),
    ("Parental leave", "New parents may take up to six months off, of which the first three are paid in full.",
     "How long can I stay at home after my baby is born?"),
    ("Security badge", "A lost access card must be reported to reception immediately so that it can be blocked.",
     "I misplaced the card that opens the doors, what now?"),
]


# A second set of the same kind, written as a check on the first: house rules of a block of flats, asked about in
# other words. The reranker's lead (rag._close_enough) was chosen on the handbook above; this set was written
# before it was, and is reported beside it (BENCHMARKS.md §5).
HOUSE_RULES = [
    ("Quiet hours", "Residents must keep noise down between ten at night and seven in the morning.",
     "Until what time can I play loud music in the evening?"),
    ("Rubbish", "Household waste goes in the grey bins in the courtyard; glass is collected separately on Tuesdays.",
     "Where do I throw away my trash?"),
    ("Pets", "Cats and small dogs are welcome, but tenants must register each animal with the landlord.",
     "Can I bring my puppy when I move in?"),
    ("Rent", "The monthly payment is due on the first day of the month and is late after the fifth.",
     "By which date do I need to send the money for my flat?"),
    ("Bicycles", "Bikes must be stored in the basement room next to the laundry, never in the stairwell.",
     "Is it ok to leave my cycle in the hallway?"),
    ("Heating", "Radiators are switched on from October to April; report cold rooms to the caretaker.",
     "My apartment is freezing in winter, who do I tell?"),
    ("Keys", "Replacement keys cost forty euros and take a week to cut.",
     "What happens if I lose the thing that opens my front door?"),
    ("Smoking", "Lighting cigarettes is forbidden in all shared areas, including balconies facing the garden.",
     "May I have a smoke on the terrace?"),
    ("Subletting", "Renting your flat to someone else requires written permission from the owner.",
     "Can I let a friend live in my place while I travel for a year?"),
    ("Laundry", "The washing machines may be booked for two hours at a time using the sheet on the door.",
     "How do I reserve the washers downstairs?"),
]


def sections():
    """(number, question, answer) for every question of the FAQ, in order."""
    with gzip.open(FAQ, "rt", encoding="utf-8") as f:
        text = f.read()
    # The table of contents comes first; the body starts at the first chapter heading.
    body = text[text.index("Chapter\u00a01."):]
    heading = re.compile(r"^(\d+\.\d+)\.\s(.+)$", re.M)
    matches = list(heading.finditer(body))
    result = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(body)
        answer = body[match.end():end]
        # A long question wraps: its heading runs to the first blank line.
        continued, _, answer = answer.partition("\n\n")
        question = " ".join([match.group(2).strip()] + [line.strip() for line in continued.splitlines() if line.strip()])
        answer = re.split(r"^Chapter\s\d+\.", answer, flags=re.M)[0]
        # Sub-section headings (1.2.3.) stay in the answer as text: they are part of it.
        answer = "\n".join(line.strip() for line in answer.strip().splitlines())
        if len(answer) < 80 or "?" not in question:
            continue  # a heading without a question or a stub, not a question-answer pair
        result.append((match.group(1), question, answer))
    return result


def debian_faq() -> Corpus:
    pairs = sections()
    return Corpus(
        name="faq", collection="faq", description="Debian FAQ (debian-faq package)",
        gold="any chunk of the answer's section (the FAQ's question kept out of it)",
        documents=[Document(number, f"Debian FAQ {number}", answer) for number, _question, answer in pairs],
        questions=[Question(question, number) for number, question, _answer in pairs],
        unanswerable=IN_DOMAIN_UNANSWERABLE)


def postgresql_manual() -> Corpus:
    import pgdocs_set
    documents = []
    for page in pgdocs_set.PAGES:
        with open(f"{MANUAL}/{page}.html", encoding="utf-8") as f:
            html = f.read()
        # The page's own title ("CREATE DATABASE", "20.4. Resource Consumption"), as a user would name it.
        title = re.search(r"<title>(.*?)</title>", html, re.S)
        name = " ".join(markup.unescape(title.group(1)).split()) if title else page
        documents.append(Document(page, name, html, "html"))
    return Corpus(
        name="pgdocs", collection="pgdocs",
        description="PostgreSQL 15 manual (postgresql-doc-15 package, 70 HTML pages ingested with format => 'html')",
        gold="the chunk holding the words of the answering sentence",
        documents=documents,
        questions=[Question(question, page, phrase, kind) for page, question, phrase, kind in pgdocs_set.QUESTIONS],
        unanswerable=pgdocs_set.UNANSWERABLE)


if __name__ == "__main__":
    pairs = sections()
    print(len(pairs), "questions")
    for number, question, answer in pairs[:5]:
        print(number, question, len(answer))
