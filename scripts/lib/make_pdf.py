"""Writes a plain-text PDF of N pages (Helvetica, one paragraph block per page) for the benchmarks, with the
standard library only: a deterministic stand-in for "a 100-page report"."""
import random
import sys

WORDS = ("notice period staff leave holiday policy manager contract salary review office remote travel expense "
         "security password access badge training onboarding benefit pension health insurance parking canteen "
         "quarterly budget forecast revenue risk compliance audit customer supplier invoice payment").split()


def escape(text):
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def page_lines(rng, page):
    lines = [f"Section {page}. Report page {page} of the annual operations review."]
    for _ in range(44):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(9, 13))).capitalize() + ".")
    return lines


def make_pdf(pages, path):
    rng = random.Random(42)
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for page in range(1, pages + 1):
        body = "BT /F1 10 Tf 12 TL 50 790 Td " + " ".join(f"({escape(line)}) Tj T*" for line in page_lines(rng, page)) + " ET"
        objects.append(f"<< /Length {len(body.encode())} >>\nstream\n{body}\nendstream")
        content = len(objects)
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << /F1 3 0 R >> >> /Contents {content} 0 R >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {pages} >>"
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    with open(path, "wb") as handle:
        handle.write(out)


if __name__ == "__main__":
    make_pdf(int(sys.argv[1]), sys.argv[2])
