//! A slab of values addressed by index, with reuse of freed slots: the block and segment arenas.

pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    vacant: Vec<usize>,
}

impl<T> Slab<T> {
    pub fn new() -> Self {
        Slab {
            items: Vec::new(),
            vacant: Vec::new(),
        }
    }
    pub fn insert(&mut self, v: T) -> usize {
        match self.vacant.pop() {
            Some(i) => {
                self.items[i] = Some(v);
                i
            }
            None => {
                self.items.push(Some(v));
                self.items.len() - 1
            }
        }
    }
    pub fn remove(&mut self, i: usize) -> T {
        self.vacant.push(i);
        self.items[i].take().expect("slab slot is occupied")
    }
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (i, v)))
    }
}

impl<T> std::ops::Index<usize> for Slab<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        self.items[i].as_ref().expect("slab slot is occupied")
    }
}
impl<T> std::ops::IndexMut<usize> for Slab<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        self.items[i].as_mut().expect("slab slot is occupied")
    }
}
