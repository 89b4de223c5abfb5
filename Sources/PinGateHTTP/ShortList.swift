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
    private enum Storage {
        case none
        case one(Element)
        case two(Element, Element)
        case three(Element, Element, Element)
        case many([Element])
    }

    private var storage = Storage.none

    /// Empty.
    init() {}

    /// `first` alone. (No array literal: its elements would arrive as a variadic array,
    /// the allocation this type is for avoiding.)
    init(_ first: Element) {
        storage = .one(first)
    }

    /// `first`, then `second`.
    init(_ first: Element, _ second: Element) {
        storage = .two(first, second)
    }

    /// `first`, `second`, then `third`.
    init(_ first: Element, _ second: Element, _ third: Element) {
        storage = .three(first, second, third)
    }

    /// `elements`, in order.
    init(_ elements: some Sequence<Element>) {
        for element in elements { append(element) }
    }

    var startIndex: Int { 0 }

    var endIndex: Int {
        switch storage {
        case .none: 0
        case .one: 1
        case .two: 2
        case .three: 3
        case .many(let all): all.count
        }
    }

    subscript(position: Int) -> Element {
        switch (storage, position) {
        case (.one(let first), 0), (.two(let first, _), 0), (.three(let first, _, _), 0): first
        case (.two(_, let second), 1), (.three(_, let second, _), 1): second
        case (.three(_, _, let third), 2): third
        case (.many(let all), _): all[position]
        default: preconditionFailure("element \(position) of \(count): out of range")
        }
    }

    /// Adds `element` after the others.
    mutating func append(_ element: Element) {
        switch storage {
        case .none:
            storage = .one(element)
        case .one(let first):
            storage = .two(first, element)
        case .two(let first, let second):
            storage = .three(first, second, element)
        case .three(let first, let second, let third):
            var all: [Element] = []
            all.reserveCapacity(8)
            all.append(contentsOf: [first, second, third, element])
            storage = .many(all)
        case .many(var all):
            // Out of the enum first, so the array is not shared and grows in place.
            storage = .none
            all.append(element)
            storage = .many(all)
        }
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
