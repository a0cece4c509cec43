//! The order inodes are written in, and their numbers: as tar2sqfs does it,
//! so that directory listings (and their sizes) come out the same.

use super::tree::{Kind, Tree, ROOT};

/// Sorts the children of every directory by name into one list; a
/// directory's `a` becomes where its children start in it, `b` how many.
pub fn sort_children(tree: &mut Tree) -> Vec<u32> {
    let nodes = tree.nodes.len() as u32;
    let mut children: Vec<u32> = (1..nodes).collect();
    children.sort_unstable_by(|&x, &y| {
        (tree.nodes[x].parent, tree.name(x)).cmp(&(tree.nodes[y].parent, tree.name(y)))
    });
    let mut i = 0;
    while i < children.len() {
        let parent = tree.nodes[children[i]].parent;
        let start = i;
        while i < children.len() && tree.nodes[children[i]].parent == parent {
            i += 1;
        }
        tree.nodes[parent].a = start as u32;
        tree.nodes[parent].b = (i - start) as u32;
    }
    children
}

/// Where directory `d`'s children are in the list [`sort_children`] made.
pub fn children_range(tree: &Tree, d: u32) -> std::ops::Range<usize> {
    let n = &tree.nodes[d];
    n.a as usize..(n.a + n.b) as usize
}

/// The inodes in the order to write them, and each node's inode number
/// (index + 1 in that order; 0 for hard links, which have no inode of their
/// own). Depth first: a directory's subdirectories first, then all its
/// children, the root last; then a hard link's inode moves to just before
/// the first directory that lists it, if it came later. Children always
/// come before their directory.
pub fn inode_order(tree: &Tree, children: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let mut base = Vec::with_capacity(tree.nodes.len());
    let mut stack = vec![(ROOT, 0usize)];
    while let Some(&mut (d, ref mut next)) = stack.last_mut() {
        let range = children_range(tree, d);
        let sub = children[range.clone()][*next..]
            .iter()
            .position(|&c| tree.nodes[c].kind == Kind::Dir);
        if let Some(k) = sub {
            let child = children[range.start + *next + k];
            *next += k + 1;
            stack.push((child, 0));
            continue;
        }
        base.extend(
            children[range]
                .iter()
                .copied()
                .filter(|&c| tree.nodes[c].kind != Kind::HardLink),
        );
        stack.pop();
    }
    base.push(ROOT);
    let mut number = vec![0u32; tree.nodes.len()];
    let mut order = Vec::with_capacity(base.len());
    for &n in &base {
        if number[n as usize] != 0 {
            continue;
        }
        if tree.nodes[n].kind == Kind::Dir {
            for &c in &children[children_range(tree, n)] {
                let node = &tree.nodes[c];
                if node.kind == Kind::HardLink && number[node.c as usize] == 0 {
                    order.push(node.c);
                    number[node.c as usize] = order.len() as u32;
                }
            }
        }
        order.push(n);
        number[n as usize] = order.len() as u32;
    }
    (order, number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::sqfs::tree::Meta;

    #[test]
    fn subdirectories_first_then_children_root_last_links_moved_up() {
        // /a/ (x, y/), /b (-> hard link to a/x is "z" in the root), /c
        let mut t = Tree::new(Meta::default());
        let m = Meta::default();
        let a = t.add_child(ROOT, b"a", Kind::Dir, m).unwrap();
        let x = t.add_child(a, b"x", Kind::File, m).unwrap();
        let y = t.add_child(a, b"y", Kind::Dir, m).unwrap();
        let b = t.add_child(ROOT, b"b", Kind::File, m).unwrap();
        let z = t.add_child(ROOT, b"z", Kind::HardLink, m).unwrap();
        let w = t.add_child(y, b"w", Kind::File, m).unwrap();
        t.nodes[z].c = w;
        let children = sort_children(&mut t);
        let (order, number) = inode_order(&t, &children);
        // y's child w, then a's children x y, then the root's a b, root.
        assert_eq!(order, vec![w, x, y, a, b, ROOT]);
        assert_eq!(number[w as usize], 1);
        assert_eq!(number[ROOT as usize], 6);
        assert_eq!(number[z as usize], 0);

        // A link whose target comes after the directory listing it moves up.
        let mut t = Tree::new(Meta::default());
        let d = t.add_child(ROOT, b"d", Kind::Dir, m).unwrap();
        let l = t.add_child(d, b"l", Kind::HardLink, m).unwrap();
        let f = t.add_child(ROOT, b"f", Kind::File, m).unwrap();
        t.nodes[l].c = f;
        let children = sort_children(&mut t);
        let (order, _) = inode_order(&t, &children);
        assert_eq!(order, vec![f, d, ROOT]);
    }
}
