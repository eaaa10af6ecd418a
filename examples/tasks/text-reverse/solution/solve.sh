#!/bin/bash
tac in.txt > out.txt
