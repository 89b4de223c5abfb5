import PropertyBased
import Testing
@testable import PinGateHTTP

/// The router's lists of steps: up to three kept inline, the rest in an array, always in
/// the order appended.
@Suite("Short list")
struct ShortListTests {
    @Test("property: whatever is appended, one at a time, as lists, or as a literal, reads back as the array built the same way")
    func sameAsArray() async {
        // Each operation: 0 appends one element, 1..4 appends a list of that many (+=).
        let operations = Gen.int(in: 0...4).array(of: 0...20)
        await propertyCheck(count: 300, input: operations) { operations in
            var list = ShortList<Int>()
            var array: [Int] = []
            var next = 0
            for operation in operations {
                if operation == 0 {
                    list.append(next)
                    array.append(next)
                    next += 1
                } else {
                    let more = Array(next..<(next + operation))
                    next += operation
                    list += ShortList(more)
                    array += more
                }
                #expect(Array(list) == array)
                #expect(list.count == array.count && list.isEmpty == array.isEmpty)
                for index in array.indices { #expect(list[index] == array[index]) }
            }
            #expect(ShortList(array) == list)
        }
    }

    @Test("one, two or three given at once keep their order, and a fourth appended follows them")
    func givenAtOnce() {
        #expect(ShortList<String>().isEmpty)
        #expect(Array(ShortList("a")) == ["a"])
        #expect(Array(ShortList("a", "b")) == ["a", "b"])
        var list = ShortList("a", "b", "c")
        #expect(Array(list) == ["a", "b", "c"])
        list.append("d")
        #expect(Array(list) == ["a", "b", "c", "d"] && list.last == "d" && list.count == 4)
    }
}
