#!/bin/bash
paste -sd+ notes.txt | bc > answer.txt
