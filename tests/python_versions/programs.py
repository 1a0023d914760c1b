"""Small programs that exercise the bytecode each CPython version compiles differently (used
by test_bytecode_versions.py). Each comment names the 3.13 instruction the program is for."""
import torch


def pair_load(x, y):                      # LOAD_FAST_LOAD_FAST
    return x + y


def pair_store(x):                        # STORE_FAST_STORE_FAST, STORE_FAST_LOAD_FAST
    total = x[0] * 0
    for i, v in enumerate(x.unbind(0)):
        total = total + v * i
    y = total * 2
    return y + 1


def truth_and_compare(x, flag, n):        # TO_BOOL, COMPARE_OP's bool bit, UNARY_NOT
    if flag and n > 2:
        x = x + 1
    if not flag:
        x = x - 1
    return x * (n >= 3)


def keyword_calls(x):                     # CALL_KW
    return torch.sum(x, dim=0, keepdim=True) + x.clamp(min=0.0)


def _helper(a, b, scale=1.0):
    return (a + b) * scale


def star_calls(x):                        # CALL_FUNCTION_EX
    args, kw = (x, x), {"scale": 2.0}
    return _helper(*args, **kw) + _helper(*args)


def formatting(x):                        # CONVERT_VALUE, FORMAT_SIMPLE, FORMAT_WITH_SPEC
    label = f"{x.shape[0]!r}:{x.dim():>3}{x.dtype}"
    return x * len(label)


def make_functions(x):                    # MAKE_FUNCTION + SET_FUNCTION_ATTRIBUTE
    scale = 3.0

    def inner(t, k=2.0, *, shift=1.0):
        return t * k * scale + shift
    return inner(x) + inner(x, 1.0, shift=0.0)


def comprehension(x):                     # LOAD_FAST_AND_CLEAR
    t = x * 3
    parts = [t * 2 for t in x.unbind(0)]
    return sum(parts) + t


def method_and_global_calls(x):           # LOAD_ATTR / LOAD_GLOBAL with NULL|self
    return torch.relu(x).mul(2).add(torch.ones_like(x))


# -- graph breaks at the instructions above ------------------------------------------------

def break_at_call_kw(x):                  # CALL_KW runs in the entry
    y = x * 2
    print("", end="")
    return y + 1


def break_at_call_ex(x):                  # CALL_FUNCTION_EX runs in the entry
    y = x.sin()
    print(*("",), end="")
    return y.cos()


def break_on_compare(x):                  # COMPARE_OP (bool) then a branch on a tensor
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def break_on_truth(x):                    # TO_BOOL of a tensor before a branch
    y = x * 2
    if y.sum():
        y = y + 1
    return y - 1


def break_on_not(x):                      # TO_BOOL; UNARY_NOT of a tensor
    y = x.sum() > 0
    z = not y
    return x + z


def break_at_format(x):                   # FORMAT_SIMPLE of a tensor runs in the entry
    y = x + 1
    s = f"{y.sum()}"
    return y * len(s)


def break_in_loop(x):                     # a resume inside a for loop: FOR_ITER's exit
    total = x[0] * 0
    for t in x.unbind(0):
        total = total + t
        print("", end="")
    return total


def break_with_closure(x):                # LOAD_FAST of a cell (3.13's LOAD_CLOSURE)
    scale = x.sum()
    print("", end="")
    f = lambda t: t * scale             # noqa: E731
    return f(x)


def break_with_many_locals(x):            # the resume's locals pass index 15: pairs split
    y = z = None
    a0, a1, a2, a3, a4, a5 = x + 0, x + 1, x + 2, x + 3, x + 4, x + 5
    a6, a7, a8, a9, a10, a11 = x + 6, x + 7, x + 8, x + 9, x + 10, x + 11
    a12, a13, a14, a15, a16 = x + 12, x + 13, x + 14, x + 15, x + 16
    print("", end="")
    y = a0 * 2
    z = a16 * 3
    return (y + z, a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14
            + a15)


def return_const(x, out):                 # RETURN_CONST
    out.add_(x * 2)
    return None
