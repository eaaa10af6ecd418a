#!/bin/bash
paste -sd+ notes.txt | bc > out.txt
