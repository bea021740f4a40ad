"""hops"""
