import PropertyBased
import Testing
@testable import PinGateHTTP

/// Field values read as comma-separated lists in place: the same elements `split` gives,
/// empty ones included, so a `Content-Length: 5,,5` or `Host: a,` reads as before.
@Suite("Comma-separated field elements")
struct CommaSeparatedElementsTests {
    @Test("property: for any text of commas, spaces, letters and digits, the elements are split's, empty ones included, in order")
    func sameAsSplit() async {
        let character = Gen.int(in: 0...6).map { [",", " ", "a", "7", "\t", ",", "é"][$0] }
        await propertyCheck(count: 500, input: character.array(of: 0...24)) { characters in
            let value = characters.joined()
            let elements = Array(CommaSeparatedElements(value))
            #expect(elements == value.split(separator: ",", omittingEmptySubsequences: false), "\(value)")
        }
    }

    @Test("a value with no comma is one element; an empty value is one empty element")
    func edges() {
        #expect(Array(CommaSeparatedElements("42")) == ["42"])
        #expect(Array(CommaSeparatedElements("")) == [""])
        #expect(Array(CommaSeparatedElements("5, 5")) == ["5", " 5"])
    }

    @Test("property: trimming optional whitespace takes spaces and tabs off both ends and nothing else, of whole values and of slices of longer text")
    func trimming() async {
        let character = Gen.int(in: 0...5).map { [" ", "\t", "a", ",", "é", " "][$0] }
        await propertyCheck(count: 1000, input: character.array(of: 0...16)) { characters in
            let whole = "x" + characters.joined() + "y"
            let slice = whole.dropFirst().dropLast()
            let trimmed = slice.trimmingASCIISpaces()
            // The reference: drop spaces and tabs from each end, one character at a time.
            var expected = Substring(characters.joined())
            while let first = expected.first, first == " " || first == "\t" { expected.removeFirst() }
            while let last = expected.last, last == " " || last == "\t" { expected.removeLast() }
            #expect(trimmed == expected, "\(slice.debugDescription)")
            #expect(trimmed.isEmpty || (trimmed.startIndex >= slice.startIndex && trimmed.endIndex <= slice.endIndex))
        }
        #expect(" \t a b \t".dropFirst(0).trimmingASCIISpaces() == "a b")
        #expect(" \t ".dropFirst(0).trimmingASCIISpaces() == "")
    }
}
