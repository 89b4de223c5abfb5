import PropertyBased
import Testing
@testable import PinGateHTTP

/// The router's exchange tables: a few entries searched in order, which must answer as a
/// dictionary would.
@Suite("Small table")
struct SmallTableTests {
    @Test("property: over random sets, updates, removals by nil and by removeValue, and reads, the table answers, and iterates, as a dictionary does")
    func behavesAsADictionary() async {
        // A step: key 0...7, then 0 sets, 1 sets nil, 2 removes, 3 reads.
        await propertyCheck(count: 400, input: Gen.int(in: 0...31).array(of: 1...200)) { steps in
            var table = SmallTable<Int, Int>()
            var model: [Int: Int] = [:]
            for (index, step) in steps.enumerated() {
                let key = step % 8
                switch step / 8 {
                case 0:
                    table[key] = index
                    model[key] = index
                case 1:
                    table[key] = nil
                    model[key] = nil
                case 2:
                    #expect(table.removeValue(forKey: key) == model.removeValue(forKey: key))
                default:
                    #expect(table[key] == model[key])
                }
                #expect(table.count == model.count)
                #expect(table.keys.sorted() == model.keys.sorted())
                #expect(table.values.sorted() == model.values.sorted())
                #expect(Dictionary(uniqueKeysWithValues: table.map { ($0.key, $0.value) }) == model)
                #expect(table.containsValue { $0 == index } == model.values.contains(index))
                #expect(table.allValues { $0 <= index } == model.values.allSatisfy { $0 <= index })
            }
        }
    }

    @Test("an entry removed from the middle leaves the others reachable")
    func removalFromTheMiddle() {
        var table = SmallTable<Int, String>()
        for key in 1...4 { table[key] = "v\(key)" }
        #expect(table.removeValue(forKey: 2) == "v2")
        #expect(table[1] == "v1" && table[3] == "v3" && table[4] == "v4" && table[2] == nil)
        #expect(table.count == 3)
    }
}
