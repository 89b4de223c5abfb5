import PropertyBased
import Testing
@testable import PinGateHTTP

/// Field values read as comma-separated lists in place: the same elements `split` gives,
/// empty ones included, so a `Content-Length: 5,,5` or `Host: a,` reads as before.
@Suite("Comma-separated field elements")
struct CommaSeparatedElementsTests {
    @Test("property: for any text of commas, spaces, letters, digits and non-ASCII text (a combining mark after a comma too), the elements are the bytes between the commas, empty ones included, in order")
    func sameAsSplit() async {
        let character = Gen.int(in: 0...7).map { [",", " ", "a", "7", "\t", ",", "é", "\u{301}"][$0] }
        await propertyCheck(count: 500, input: character.array(of: 0...24)) { characters in
            let value = characters.joined()
            let elements = Array(CommaSeparatedElements(value)).map { Array($0.utf8) }
            // The reference splits the bytes: a comma followed by a combining mark is one
            // `Character` to `split(separator: ",")`, but still a comma to HTTP.
            let expected = value.utf8.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false).map { Array($0) }
            #expect(elements == expected, "\(value.debugDescription)")
        }
    }

    @Test("a value with no comma is one element; an empty value is one empty element")
    func edges() {
        #expect(Array(CommaSeparatedElements("42")) == ["42"])
        #expect(Array(CommaSeparatedElements("")) == [""])
        #expect(Array(CommaSeparatedElements("5, 5")) == ["5", " 5"])
        #expect(Array(CommaSeparatedElements("5,\u{301}5")).map { Array($0.utf8) } == [Array("5".utf8), Array("\u{301}5".utf8)])
    }

    @Test("property: trimming optional whitespace takes space and tab bytes off both ends and nothing else (a space before a combining mark too), of whole values and of slices of longer text")
    func trimming() async {
        let character = Gen.int(in: 0...6).map { [" ", "\t", "a", ",", "é", " ", "\u{301}"][$0] }
        await propertyCheck(count: 1000, input: character.array(of: 0...16)) { characters in
            // Cut out of longer text by byte: `dropFirst` would take a leading combining
            // mark with the "x" it joins.
            let whole = "x" + characters.joined() + "y"
            let slice = whole[whole.utf8.index(after: whole.startIndex)..<whole.utf8.index(before: whole.endIndex)]
            let trimmed = slice.trimmingASCIISpaces()
            // The reference: space and tab bytes dropped from each end of the bytes.
            var expected = Array(characters.joined().utf8)[...]
            while let first = expected.first, first == 0x20 || first == 0x09 { expected.removeFirst() }
            while let last = expected.last, last == 0x20 || last == 0x09 { expected.removeLast() }
            #expect(Array(trimmed.utf8) == Array(expected), "\(slice.debugDescription)")
        }
        #expect(" \t a b \t".dropFirst(0).trimmingASCIISpaces() == "a b")
        #expect(" \t ".dropFirst(0).trimmingASCIISpaces() == "")
        #expect(Array(" \u{301}x".dropFirst(0).trimmingASCIISpaces().utf8) == Array("\u{301}x".utf8))
    }
}
