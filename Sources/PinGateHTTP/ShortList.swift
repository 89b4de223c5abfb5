/// A list that keeps up to three elements inline and allocates only for a fourth: what the
/// router's state returns for each input (its steps, `TunnelRouterState.Actions`) and the
/// credit ledger for a drain.
///
/// Why not an array: every input to the router returns its steps, a keep-alive request
/// makes about eight inputs, and most ask for one to three steps. As arrays they were about
/// seven allocations per request (issue 32's malloc profile: array storage for each input's
/// steps, and regrowth when a fourth came). Only a rare input that asks for more (a
/// tunnel's end, a reconnect) allocates now.
struct ShortList<Element>: RandomAccessCollection {
    // Each element in a slot of its own, so appending writes one slot and reading one
    // copies only that one. (Kept first as an enum of one, two or three payloads, every
    // append re-wrapped and every read switched over a copy of all of them, with a retain
    // and release per payload: fewer allocations, but more CPU per request than the arrays.)
    private var first: Element?
    private var second: Element?
    private var third: Element?
    private var rest: [Element] = []
    /// How many elements there are.
    private(set) var count = 0

    /// Empty.
    init() {}

    /// `first` alone. (No array literal: its elements would arrive as a variadic array,
    /// the allocation this type is for avoiding.)
    init(_ first: Element) {
        self.first = first
        count = 1
    }

    /// `first`, then `second`.
    init(_ first: Element, _ second: Element) {
        self.first = first
        self.second = second
        count = 2
    }

    /// `first`, `second`, then `third`.
    init(_ first: Element, _ second: Element, _ third: Element) {
        self.first = first
        self.second = second
        self.third = third
        count = 3
    }

    /// `elements`, in order.
    init(_ elements: some Sequence<Element>) {
        for element in elements { append(element) }
    }

    var startIndex: Int { 0 }

    var endIndex: Int { count }

    subscript(position: Int) -> Element {
        precondition(position >= 0 && position < count, "element \(position) of \(count): out of range")
        let slot: Element?
        switch position {
        case 0: slot = first
        case 1: slot = second
        case 2: slot = third
        default: return rest[position - 3]
        }
        guard let element = slot else { preconditionFailure("element \(position) of \(count): an empty slot") }
        return element
    }

    /// Adds `element` after the others.
    mutating func append(_ element: Element) {
        switch count {
        case 0: first = element
        case 1: second = element
        case 2: third = element
        default:
            if rest.isEmpty { rest.reserveCapacity(5) }
            rest.append(element)
        }
        count += 1
    }

    /// Adds `others` after these, in their order.
    mutating func append(contentsOf others: ShortList) {
        for element in others { append(element) }
    }

    /// `left`'s elements, then `right`'s.
    static func += (left: inout ShortList, right: ShortList) {
        left.append(contentsOf: right)
    }
}

extension ShortList: Equatable where Element: Equatable {
    /// The same elements in the same order.
    static func == (left: ShortList, right: ShortList) -> Bool {
        left.elementsEqual(right)
    }
}
