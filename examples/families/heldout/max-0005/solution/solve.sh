#!/bin/bash
sort -n notes.txt | tail -n 1 > out.txt
