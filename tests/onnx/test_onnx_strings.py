"""String tensors: the string ops the host runs before the kernels (polyc.onnx.strings), on their own and
feeding compiled kernels, compared with onnxruntime where it runs them and with the ONNX spec's worked
semantics where it cannot (onnxruntime's StringNormalizer needs an installed en_US locale)."""
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

import polyc.onnx
from polyc.errors import PolycError, ShapeError, UnsupportedError
from polyc.onnx import ModelError
from polyc.onnx.strings import HostNode, StringStage

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)


def model(nodes, inputs, outputs, opset=20, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def strings(*values):
    return np.array(values, dtype=object)


def normalizer(shape, **attrs):
    return model([helper.make_node("StringNormalizer", ["x"], ["y"], **attrs)], [("x", T.STRING, shape)],
                 [("y", T.STRING, list(shape[:-1]) + ["c"])], opset=17)


NORMALIZER_CASES = [
    # (attrs, input, expected): the spec's rules worked by hand
    ({}, ["monday", "Tuesday"], ["monday", "Tuesday"]),
    ({"case_change_action": "LOWER"}, ["MonDay", "TUESDAY"], ["monday", "tuesday"]),
    ({"case_change_action": "UPPER", "stopwords": ["monday"]}, ["Monday", "monday", "tue"], ["TUE"]),
    ({"stopwords": ["monday"], "is_case_sensitive": 1}, ["Monday", "monday", "tue"], ["Monday", "tue"]),
    ({"stopwords": ["MONDAY"], "case_change_action": "LOWER"}, ["monday", "Friday"], ["friday"]),
    ({"stopwords": ["a", "b"]}, ["A", "b"], [""]),  # every string dropped: one empty string
    ({"case_change_action": "UPPER"}, ["straße", "éa"], ["STRAßE", "ÉA"]),  # ß has no one-letter capital
    ({"case_change_action": "LOWER", "stopwords": ["ÉTÉ"]}, ["été", "Hiver"], ["hiver"]),
]


@pytest.mark.parametrize("attrs, words, expected", NORMALIZER_CASES)
def test_string_normalizer_follows_the_spec(attrs, words, expected):
    m = polyc.onnx.compile(normalizer([len(words)], **attrs))
    (y,) = m(strings(*words))
    assert y.dtype == object and y.shape == (len(expected),)
    assert y.tolist() == expected


def test_string_normalizer_keeps_the_row_of_a_1_by_c_input():
    m = polyc.onnx.compile(normalizer([1, 3], stopwords=["x"], case_change_action="UPPER"))
    (y,) = m(np.array([["a", "x", "b"]], dtype=object))
    assert y.shape == (1, 2) and y.tolist() == [["A", "B"]]
    (y,) = m(np.array([["x", "X", "x"]], dtype=object))
    assert y.shape == (1, 1) and y.tolist() == [[""]]


def test_string_normalizer_rejects_other_ranks_and_actions_naming_the_node():
    with pytest.raises(ModelError, match=r"StringNormalizer.*\[1,C\]"):
        polyc.onnx.compile(normalizer([2, 3]))
    with pytest.raises(ModelError, match="case_change_action 'TITLE'"):
        polyc.onnx.compile(normalizer([3], case_change_action="TITLE"))


def ort_run(m, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_split_counts_feed_compiled_kernels_like_onnxruntime():
    """StringSplit's counts (int64) go through compiled kernels; its pieces are a string output whose width
    depends on the strings fed, and Equal / RegexFullMatch / StringConcat run on the host beside it."""
    nodes = [
        helper.make_node("StringSplit", ["x"], ["pieces", "counts"], delimiter=","),
        helper.make_node("Cast", ["counts"], ["cf"], to=T.FLOAT),
        helper.make_node("Mul", ["cf", "w"], ["scaled"]),
        helper.make_node("Equal", ["x", "y"], ["same"]),
        helper.make_node("Cast", ["same"], ["same_f"], to=T.FLOAT),
        helper.make_node("Add", ["scaled", "same_f"], ["score"]),
        helper.make_node("RegexFullMatch", ["y"], ["is_word"], pattern=r"[a-z]+\d?"),
        helper.make_node("StringConcat", ["x", "y"], ["joined"]),
    ]
    w = helper.make_tensor("w", T.FLOAT, [3], [0.5, 2.0, -1.0])
    m = model(nodes, [("x", T.STRING, [3]), ("y", T.STRING, [3])],
              [("score", T.FLOAT, [3]), ("pieces", T.STRING, [3, "w"]), ("is_word", T.BOOL, [3]),
               ("joined", T.STRING, [3])], inits=[w])
    compiled = polyc.onnx.compile(m)
    assert compiled.steps, "the numeric part must be compiled kernels"
    for x, y in [(["a,b", ",", "c,,d"], ["a,b", "x1", "Q"]), (["one", "t,w,o,,", "é,ü"], ["no", "t,w,o,,", "ab"])]:
        feeds = {"x": strings(*x), "y": strings(*y)}
        got, want = compiled(feeds), ort_run(m, feeds)
        np.testing.assert_array_equal(got[0], want[0])
        for g, e in zip(got[1:], want[1:]):
            assert g.shape == e.shape and g.tolist() == e.tolist()


def split_model(**attrs):
    return model([helper.make_node("StringSplit", ["x"], ["p", "n"], **attrs)], [("x", T.STRING, [2, 2])],
                 [("p", T.STRING, [2, 2, "w"]), ("n", T.INT64, [2, 2])])


def test_whitespace_split_and_maxsplit_like_onnxruntime():
    m = split_model(maxsplit=1)
    feeds = {"x": np.array([["  a  b c", ""], ["x", " q r "]], dtype=object)}
    got, want = polyc.onnx.compile(m)(feeds), ort_run(m, feeds)
    assert got[0].tolist() == want[0].tolist()
    np.testing.assert_array_equal(got[1], want[1])


def test_split_where_onnxruntime_departs_from_the_spec():
    """The spec's rules (Python's str.split): any whitespace separates; an empty string split on a delimiter
    is one empty piece."""
    (p, n) = polyc.onnx.compile(split_model())(np.array([["a\tb\n c", ""], ["x", "\u2003y"]], dtype=object))
    assert p.tolist() == [[["a", "b", "c"], ["", "", ""]], [["x", "", ""], ["y", "", ""]]]
    assert n.tolist() == [[3, 0], [1, 1]]
    (p, n) = polyc.onnx.compile(split_model(delimiter="-"))(np.array([["", "a--b"], ["-", "c"]], dtype=object))
    assert p.tolist() == [[["", "", ""], ["a", "", "b"]], [["", "", ""], ["c", "", ""]]]
    assert n.tolist() == [[1, 3], [2, 1]]


def test_string_feeds_are_converted_or_refused_by_name():
    m = polyc.onnx.compile(normalizer([2], case_change_action="UPPER"))
    assert m(np.array(["ab", "c"])).pop().tolist() == ["AB", "C"]  # numpy str_
    assert m(np.array([b"ab", "é".encode()], dtype=object)).pop().tolist() == ["AB", "É"]  # UTF-8 bytes
    with pytest.raises(ShapeError, match="input 'x': expected a string tensor"):
        m(np.zeros(2, dtype=np.float32))
    with pytest.raises(ShapeError, match="input 'x': element 1 is a int"):
        m(np.array(["a", 3], dtype=object))
    with pytest.raises(ShapeError, match="expected shape"):
        m(strings("a", "b", "c"))


def test_a_string_output_that_is_an_input_is_a_copy():
    m = polyc.onnx.compile(model([helper.make_node("Identity", ["x"], ["y"])], [("x", T.STRING, [2])],
                                 [("y", T.STRING, [2])]))
    x = strings("a", "b")
    (y,) = m(x)
    assert y.tolist() == ["a", "b"] and y is not x


def test_strings_outside_the_host_ops_are_a_clean_error():
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], [("x", T.STRING, [3]), ("i", T.INT64, [2])],
              [("y", T.STRING, [2])], opset=13)
    with pytest.raises(UnsupportedError, match=r"unsupported dtype string .*node Gather_0"):
        polyc.onnx.compile(m)
    bad = model([helper.make_node("RegexFullMatch", ["x"], ["y"], pattern="(a")], [("x", T.STRING, [1])],
                [("y", T.BOOL, [1])])
    with pytest.raises(ModelError, match=r"RegexFullMatch_0.*does not compile"):
        polyc.onnx.compile(bad)


def test_host_values_for_kernels_are_checked_against_their_compiled_shape():
    from polyc.onnx.graph import TensorInfo

    stage = StringStage((HostNode("split", "StringSplit", ("x",), ("p", "n"), {}),), kernel_inputs=("n",),
                        checked={"n": TensorInfo((3,), np.dtype(np.int64))})
    env, feeds = stage.kernel_feeds({"x": strings("a b", "c", "")})
    assert feeds["n"].tolist() == [2, 1, 0]
    with pytest.raises(PolycError, match=r"computed 'n' as int64\[2\].*compiled for int64\[3\]"):
        stage.kernel_feeds({"x": strings("a", "b")})
