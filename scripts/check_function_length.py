#!/usr/bin/env python3
"""Lists the C++/CUDA functions longer than a limit, counted from the first line of the
signature to the closing brace; exits 1 when there is one.

    scripts/check_function_length.py [--limit 80] PATH...

PATH: files, or folders searched for .cpp .cc .h .hpp .cu .cuh. A function is a body whose
head (the text since the previous ';', '{' or '}' of its scope) has a parameter list and no
top-level '=' (so brace initialisers and lambdas assigned at namespace scope are not
functions); constructor initialiser lists with braces and multi-line signatures count with
the signature. Member functions defined in a class count; lambdas inside a function are part
of that function. Comments, string and character literals and preprocessor lines are skipped.
"""
import argparse
import os
import re
import sys

EXTS = ('.cpp', '.cc', '.h', '.hpp', '.cu', '.cuh')


def blank(text):
    """Comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == '#':
            # a preprocessor line, with its continuations
            while i < n and text[i] != '\n':
                if text[i] == '\\' and i + 1 < n and text[i + 1] == '\n':
                    out.append(' \n')
                    i += 2
                    continue
                out.append(' ')
                i += 1
            continue
        if c == '\n':
            out.append(c)
            line_start = True
            i += 1
            continue
        if c in ' \t':
            out.append(c)
            i += 1
            continue
        line_start = False
        if text.startswith('//', i):
            while i < n and text[i] != '\n':
                out.append(' ')
                i += 1
            continue
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
            continue
        m = re.match(r'(?:u8|u|U|L)?R"([^()\\ ]{0,16})\(', text[i:i + 24])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            end = text.find(')' + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + re.sub(r'[^\n]', ' ', text[i + 2:end]))
            i = end
            continue
        if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # (1'000'000 digit separators)
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            out.append(c + ' ' * (min(j, n) - i - 1) + (c if j < n else ''))
            i = j + 1
            continue
        out.append(c)
        i += 1
    return ''.join(out)


def strip_template_prefix(head):
    h = head.lstrip()
    while h.startswith('template'):
        k = h.find('<')
        if k < 0:
            break
        depth, j = 0, k
        while j < len(h):
            if h[j] == '<':
                depth += 1
            elif h[j] == '>':
                depth -= 1
                if depth == 0:
                    break
            j += 1
        h = h[j + 1:].lstrip()
    return h


def has_top_level_equals(head):
    h = re.sub(r'\boperator\s*(\(\)|\[\]|[^\s(]+)', 'operator', head)
    depth = 0
    for k, ch in enumerate(h):
        if ch in '([':
            depth += 1
        elif ch in ')]':
            depth -= 1
        elif ch == '=' and depth == 0:
            prev = h[k - 1] if k else ''
            nxt = h[k + 1] if k + 1 < len(h) else ''
            if prev not in '=!<>' and nxt != '=':
                return True
    return False


def classify(head):
    h = strip_template_prefix(head)
    if re.match(r'(inline\s+)?namespace\b', h) or re.match(r'extern\s*""\s*$', h):
        return 'ns'
    if re.match(r'(typedef\s+)?(class|struct|union|enum)\b', h) and not re.search(r'\)\s*(const\b|noexcept\b|->|$)', h.replace('alignas', '')):
        return 'class'
    if '(' in h and ')' in h and not has_top_level_equals(h):
        return 'func'
    return 'other'


def matching_brace(s, i):
    depth = 0
    for j in range(i, len(s)):
        if s[j] == '{':
            depth += 1
        elif s[j] == '}':
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def functions(text):
    """(first line, last line, signature) of every function body in the file."""
    s = blank(text)
    line_of = [0] * (len(s) + 1)
    ln = 1
    for k, ch in enumerate(s):
        line_of[k] = ln
        if ch == '\n':
            ln += 1
    line_of[len(s)] = ln
    found = []
    stack = ['ns']          # the kinds of the scopes we are in
    head_start = [0]        # where the current head began, per scope
    i = 0
    while i < len(s):
        ch = s[i]
        if ch in ';':
            head_start[-1] = i + 1
        elif ch == '}':
            if len(stack) > 1:
                stack.pop()
                head_start.pop()
            head_start[-1] = i + 1
        elif ch == '{':
            kind = 'other'
            head = s[head_start[-1]:i]
            if stack[-1] in ('ns', 'class'):
                kind = classify(head)
            if kind == 'func' and re.search(r'\)\s*:(?!:)', head):
                # a brace of a constructor's initialiser list: part of the head
                close = matching_brace(s, i)
                after = s[close + 1:].lstrip()[:1]
                if after in (',', '{'):
                    i = close + 1
                    continue
            if kind == 'func':
                close = matching_brace(s, i)
                off = len(head) - len(head.lstrip())
                start = head_start[-1] + off
                sig = ' '.join(text[start:i].split())[:100]
                found.append((line_of[start], line_of[close], sig))
                head_start[-1] = close + 1
                i = close + 1
                continue
            stack.append(kind)
            head_start.append(i + 1)
        i += 1
    return found


def files_under(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, dirs, names in os.walk(p):
            dirs.sort()
            for name in sorted(names):
                if name.endswith(EXTS):
                    yield os.path.join(root, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--limit', type=int, default=80, help='most lines a function may have (default 80)')
    ap.add_argument('paths', nargs='+')
    a = ap.parse_args()
    long = []
    for path in files_under(a.paths):
        with open(path, encoding='utf-8', errors='replace') as f:
            text = f.read()
        for first, last, sig in functions(text):
            n = last - first + 1
            if n > a.limit:
                long.append((n, path, first, sig))
    for n, path, first, sig in sorted(long, key=lambda r: (-r[0], r[1], r[2])):
        print(f'{n} {path}:{first} {sig}')
    if long:
        print(f'{len(long)} function(s) over {a.limit} lines: split each into named steps', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
